package config

import "strconv"

// ypath is a position in a file's YAML tree ("descriptors[2].tiers[0]"),
// kept as a chain of steps on the stack and written out only when a problem
// is reported, so that loading builds no text for the positions of valid
// nodes. The nil *ypath is the root.
type ypath struct {
	up  *ypath
	key string // the key of a mapping step
	idx int    // the index of a list step; -1 for a mapping step
}

// k is the path of key in the mapping at p.
func (p *ypath) k(key string) *ypath { return &ypath{up: p, key: key, idx: -1} }

// rootPath is the path of key at the top of a file.
func rootPath(key string) *ypath { return &ypath{key: key, idx: -1} }

// i is the path of item i in the list at p.
func (p *ypath) i(i int) *ypath { return &ypath{up: p, idx: i} }

// String writes the path: keys joined by ".", indexes as "[i]". It fills
// its text from the end, so that it keeps no pointer to the steps and they
// stay on their callers' stacks.
func (p *ypath) String() string {
	n := 0
	for q := p; q != nil; q = q.up {
		if q.idx >= 0 {
			n += len(strconv.Itoa(q.idx)) + 2
		} else {
			n += len(q.key)
			if q.up != nil {
				n++
			}
		}
	}
	b := make([]byte, n)
	for q := p; q != nil; q = q.up {
		if q.idx >= 0 {
			s := strconv.Itoa(q.idx)
			n--
			b[n] = ']'
			n -= len(s)
			copy(b[n:], s)
			n--
			b[n] = '['
			continue
		}
		n -= len(q.key)
		copy(b[n:], q.key)
		if q.up != nil {
			n--
			b[n] = '.'
		}
	}
	return string(b)
}
