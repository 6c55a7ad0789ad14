package copylog

import (
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// bytesIn reads small numbers from fuzz input, 0 once exhausted.
type bytesIn struct {
	b []byte
	i int
}

func (r *bytesIn) n(mod int) int {
	if r.i >= len(r.b) {
		return 0
	}
	v := int(r.b[r.i])
	r.i++
	return v % mod
}

func (r *bytesIn) done() bool { return r.i >= len(r.b) }

var fuzzDomains = []string{"a", "b", "c", "d"}

func fuzzConfig(r *bytesIn) *Config {
	c := &Config{DomainLimit: int64(r.n(6)), GlobalLimit: int64(r.n(13))}
	for i, n := 0, r.n(4); i < n; i++ {
		g := Group{Name: fmt.Sprintf("g%d", i), Limit: int64(r.n(7))}
		mask := r.n(16)
		for j, d := range fuzzDomains {
			if mask&(1<<j) != 0 {
				g.Members = append(g.Members, d)
			}
		}
		c.Groups = append(c.Groups, g)
	}
	if d := r.n(5); d > 0 {
		c.Overrides = map[string]int64{fuzzDomains[d-1]: int64(r.n(8))}
	}
	return c
}

type snapshot struct {
	Holds     []Hold
	Transfers []Staged
	Domains   map[string]int64
	Groups    map[string]int64
	Total     int64
	Token     int64
	Records   int
}

func snap(s *State) snapshot {
	return snapshot{Holds: s.Holds(), Transfers: s.Transfers(), Domains: maps.Clone(s.domains),
		Groups: maps.Clone(s.groups), Total: s.total, Token: s.token, Records: len(s.records)}
}

// checkLimits verifies that nothing held exceeds a limit of cfg.
func checkLimits(t *testing.T, cfg *Config, s *State) {
	t.Helper()
	for d, n := range s.domains {
		if n > cfg.domainLimit(d) {
			t.Fatalf("domain %q holds %d, limit %d", d, n, cfg.domainLimit(d))
		}
	}
	if cfg.GlobalLimit > 0 && s.total > cfg.GlobalLimit {
		t.Fatalf("total %d above global limit %d", s.total, cfg.GlobalLimit)
	}
	for _, g := range cfg.Groups {
		if s.groups[g.Name] > g.Limit {
			t.Fatalf("group %q holds %d, limit %d", g.Name, s.groups[g.Name], g.Limit)
		}
	}
}

// fuzzOps runs the operation sequence encoded in data and checks the
// invariants after every operation.
func fuzzOps(t *testing.T, data []byte) {
	r := &bytesIn{b: data}
	cfg := fuzzConfig(r)
	s := &State{}
	now := t0
	var holdIDs, transferIDs []string
	type rec struct {
		holdID  string
		granted int64
		expires time.Time
	}
	records := map[string]rec{}
	newID := func(prefix string) string { return fmt.Sprintf("%s%d", prefix, len(holdIDs)+len(transferIDs)) }
	pick := func(ids []string) string {
		if len(ids) == 0 {
			return "none"
		}
		return ids[r.n(len(ids))]
	}
	ms := func(n int) time.Duration { return time.Duration(n) * 100 * time.Millisecond }
	sessions := []string{"", "s0", "s1"}
	for step := 0; step < 300 && !r.done(); step++ {
		now = now.Add(ms(r.n(8)))
		kind := r.n(16)
		pre := kind >= 8 // reap first, so that the operation's own reaping is a no-op
		kind %= 8
		if pre {
			if _, err := Expire(s, now); err != nil {
				t.Fatal(err)
			}
		}
		before := snap(s)
		var err error
		changed := true
		switch kind {
		case 0, 1:
			k := int64(1 + r.n(6))
			req := ReserveRequest{Domain: fuzzDomains[r.n(4)], Copies: k, Min: int64(r.n(int(k) + 1)),
				RequestID: []string{"", "q0", "q1", "q2"}[r.n(4)], Session: sessions[r.n(3)],
				Lease: ms(1 + r.n(10)), HoldID: newID("h")}
			var res Reservation
			res, err = Reserve(cfg, s, now, req)
			if err != nil {
				if !errors.Is(err, ErrRequestIDReused) {
					t.Fatalf("reserve %+v: %v", req, err)
				}
				changed, err = false, nil
				break
			}
			holdIDs = append(holdIDs, req.HoldID)
			old, had := records[req.RequestID]
			if pre && had && (old.expires.After(now) || s.holds[old.holdID] != nil) && !res.Replayed {
				t.Fatalf("reserve %+v with a live record %+v: not replayed: %+v", req, old, res)
			}
			if res.Replayed {
				if !had || res.HoldID != old.holdID || res.Granted != old.granted {
					t.Fatalf("replay %+v, recorded %+v (%v)", res, old, had)
				}
				if exp := now.Add(req.Lease); exp.After(old.expires) {
					old.expires = exp
				}
				records[req.RequestID] = old
				break
			}
			if !res.OK {
				changed = false
				break
			}
			min := max(req.Min, 1)
			if res.Granted < min || res.Granted > k || res.Token != before.Token+1 || res.HoldID != req.HoldID {
				t.Fatalf("reserve %+v: %+v (token before %d)", req, res, before.Token)
			}
			if res.Granted < k { // maximal: one more copy would break a limit
				d := req.Domain
				full := s.domains[d]+1 > cfg.domainLimit(d) || (cfg.GlobalLimit > 0 && s.total+1 > cfg.GlobalLimit)
				for _, g := range res.Groups {
					for _, cg := range cfg.Groups {
						full = full || (cg.Name == g && s.groups[g]+1 > cg.Limit)
					}
				}
				if !full {
					t.Fatalf("reserve %+v granted %d, not maximal", req, res.Granted)
				}
			}
			if req.RequestID != "" {
				records[req.RequestID] = rec{res.HoldID, res.Granted, now.Add(req.Lease)}
			}
		case 2, 3:
			id, c := pick(holdIDs), int64(r.n(5))
			h, live := s.Hold(id)
			var left, moved int64
			if kind == 2 {
				var res ReleaseResult
				res, err = Release(s, now, id, c)
				left, moved = res.Left, res.Released
			} else {
				x := newID("x")
				var res TransferResult
				res, err = Transfer(s, now, id, c, ms(1+r.n(10)), x)
				left, moved = res.Left, res.Copies
				if err == nil {
					transferIDs = append(transferIDs, x)
				}
			}
			expected := errors.Is(err, ErrUnknownHold) || errors.Is(err, ErrOverRelease) || errors.Is(err, ErrOverTransfer)
			changed = err == nil
			if !pre {
				if expected {
					err = nil
				}
				break
			}
			switch {
			case !live:
				if !errors.Is(err, ErrUnknownHold) {
					t.Fatalf("release/transfer of gone hold %q: %v", id, err)
				}
			case c > h.Copies:
				if !errors.Is(err, ErrOverRelease) && !errors.Is(err, ErrOverTransfer) {
					t.Fatalf("release/transfer of %d from %+v: %v", c, h, err)
				}
			case err != nil:
				t.Fatalf("release/transfer of %d from %+v: %v", c, h, err)
			default:
				want := c
				if c == 0 {
					want = h.Copies
				}
				if moved != want || left != h.Copies-want {
					t.Fatalf("release/transfer of %d from %+v: moved %d left %d", c, h, moved, left)
				}
				if kind == 2 && s.total != before.Total-want {
					t.Fatalf("release of %d: total %d -> %d", want, before.Total, s.total)
				}
				if kind == 3 && s.total != before.Total {
					t.Fatalf("transfer changed the total %d -> %d", before.Total, s.total)
				}
			}
			if expected {
				err = nil
			}
		case 4:
			x, id := pick(transferIDs), newID("h")
			var res SeizeResult
			res, err = Seize(s, now, x, id, sessions[r.n(3)], ms(1+r.n(10)))
			if err == nil {
				holdIDs = append(holdIDs, id)
				if res.Token != before.Token+1 || (pre && s.total != before.Total) {
					t.Fatalf("seize %+v, before %+v", res, before)
				}
			} else if !errors.Is(err, ErrUnknownTransfer) {
				t.Fatal(err)
			}
			changed, err = err == nil, nil
		case 5:
			if r.n(2) == 0 {
				_, err = KeepAlive(s, now, sessions[1+r.n(2)], "", ms(1+r.n(10)))
			} else {
				_, err = KeepAlive(s, now, "", pick(holdIDs), ms(1+r.n(10)))
				if errors.Is(err, ErrUnknownHold) {
					changed, err = false, nil
				}
			}
		case 6:
			_, err = ReleaseSession(s, now, sessions[1+r.n(2)])
		case 7:
			_, err = Expire(s, now)
			t0us := now.UnixMicro()
			for _, h := range s.holds {
				if h.expires <= t0us {
					t.Fatalf("hold %+v survived Expire at %d", h, t0us)
				}
			}
			for _, x := range s.transfers {
				if x.expires <= t0us {
					t.Fatalf("transfer %+v survived Expire at %d", x, t0us)
				}
			}
		}
		if err != nil {
			t.Fatalf("op %d: %v", kind, err)
		}
		if pre && !changed {
			if diff := cmp.Diff(before, snap(s)); diff != "" {
				t.Fatalf("op %d rejected but changed the state (-before +after):\n%s", kind, diff)
			}
		}
		checkLimits(t, cfg, s)
		checkCounts(t, s)
		if s.token < before.Token {
			t.Fatalf("token went back %d -> %d", before.Token, s.token)
		}
	}
}

func FuzzOps(f *testing.F) {
	f.Add([]byte{5, 12, 2, 4, 15, 6, 3, 0, 0, 3, 1, 0, 1, 2, 3, 4, 5, 8, 1, 2, 3, 9, 4, 2, 7, 1, 11, 0, 3, 13, 2})
	f.Add([]byte("\x03\x00\x01\x02\x07\x00\x00\x00\x05\x02\x01\x01\x01\x04\x00\x0a\x00\x02\x00\x02\x01\x00\x09\x00\x00\x00\x03\x01\x01\x0c\x00\x00\x00\x01\x02\x00\x0f"))
	for i := 0; i < 8; i++ {
		b := make([]byte, 400)
		x := uint32(2654435761 * (i + 1))
		for j := range b {
			x ^= x << 13
			x ^= x >> 17
			x ^= x << 5
			b[j] = byte(x)
		}
		f.Add(b)
	}
	f.Fuzz(fuzzOps)
}
