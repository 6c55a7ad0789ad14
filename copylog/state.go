package copylog

import (
	"math"
	"sort"
	"time"
)

// never is the "next" of a State with nothing that can lapse.
const never int64 = math.MaxInt64

// State is the copy log of one copy-limited resource: its holds, staged
// transfers, reservation records, the copies held per domain, per group and
// in all, and the fencing token counter (see the package documentation).
// The zero value is a resource nobody holds, with token counter 0. A State
// is not safe for concurrent use; a store serializes the operations on one
// resource.
type State struct {
	holds     map[string]*hold
	transfers map[string]*transfer
	records   map[string]*record
	sessions  map[string]map[string]struct{} // session -> hold ids
	domains   map[string]int64               // copies held per domain
	groups    map[string]int64               // copies held per group name
	total     int64                          // copies held by all domains
	token     int64                          // last fencing token issued
	// next is a lower bound of every lease, ttl and record expiry in the
	// state (never when there is none): reaping at t < next has nothing to do.
	next int64
}

type hold struct {
	id, domain, session, requestID string
	copies                         int64
	groups                         []string
	token                          int64
	expires                        int64
}

type transfer struct {
	id, domain string
	copies     int64
	groups     []string
	expires    int64
}

// record is what a retried reserve answers: kept while its hold lives and
// at least until expires (the reserve's instant plus its lease).
type record struct {
	holdID, domain string
	granted, token int64
	groups         []string
	expires        int64
}

// Hold is a read-only view of one hold.
type Hold struct {
	ID      string
	Domain  string
	Session string
	// RequestID is the reserve's request id ("" for none, and for a hold
	// made by Seize).
	RequestID string
	Copies    int64
	// Groups are the names of the groups the domain belonged to when the
	// copies were reserved: each of them counts the hold's copies.
	Groups []string
	// Token is the fencing token of the grant that made the hold.
	Token   int64
	Expires time.Time
}

// Staged is a read-only view of one staged transfer.
type Staged struct {
	ID      string
	Domain  string
	Copies  int64
	Groups  []string
	Expires time.Time
}

func (s *State) init() {
	if s.holds == nil {
		s.holds = map[string]*hold{}
		s.transfers = map[string]*transfer{}
		s.records = map[string]*record{}
		s.sessions = map[string]map[string]struct{}{}
		s.domains = map[string]int64{}
		s.groups = map[string]int64{}
		s.next = never
	}
}

// Hold returns the hold with the given id as of the last operation (lapsed
// holds stay visible until an operation reaps them).
func (s *State) Hold(id string) (Hold, bool) {
	h, ok := s.holds[id]
	if !ok {
		return Hold{}, false
	}
	return h.view(), true
}

// Holds returns every hold, sorted by id.
func (s *State) Holds() []Hold {
	out := make([]Hold, 0, len(s.holds))
	for _, h := range s.holds {
		out = append(out, h.view())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Transfers returns every staged transfer, sorted by id.
func (s *State) Transfers() []Staged {
	out := make([]Staged, 0, len(s.transfers))
	for _, x := range s.transfers {
		out = append(out, Staged{ID: x.id, Domain: x.domain, Copies: x.copies,
			Groups: clone(x.groups), Expires: time.UnixMicro(x.expires)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// DomainHeld is the number of copies domain d holds (staged copies
// included).
func (s *State) DomainHeld(d string) int64 { return s.domains[d] }

// GroupHeld is the number of copies held in the pool of the named group.
func (s *State) GroupHeld(name string) int64 { return s.groups[name] }

// TotalHeld is the number of copies all domains hold.
func (s *State) TotalHeld() int64 { return s.total }

// Token is the last fencing token issued (0: none yet).
func (s *State) Token() int64 { return s.token }

// Seed raises the fencing token counter to at least token. A store that
// drops an Empty State must keep its Token and Seed the State that replaces
// it, so that tokens keep increasing.
func (s *State) Seed(token int64) {
	if token > s.token {
		s.token = token
	}
}

// Empty reports whether s has no holds, transfers or reservation records:
// such a State is equivalent to a zero State seeded with its Token.
func (s *State) Empty() bool {
	return len(s.holds) == 0 && len(s.transfers) == 0 && len(s.records) == 0
}

// NextExpiry is a lower bound of the instants at which something in s
// lapses; a periodic reaper may skip s until then. Zero when nothing can
// lapse.
func (s *State) NextExpiry() time.Time {
	if s.holds == nil || s.next == never {
		return time.Time{}
	}
	return time.UnixMicro(s.next)
}

func (h *hold) view() Hold {
	return Hold{ID: h.id, Domain: h.domain, Session: h.session, RequestID: h.requestID,
		Copies: h.copies, Groups: clone(h.groups), Token: h.token, Expires: time.UnixMicro(h.expires)}
}

func clone(s []string) []string {
	if s == nil {
		return nil
	}
	return append([]string(nil), s...)
}

// add counts n more copies (n < 0: fewer) for domain d and groups gs.
func (s *State) add(d string, gs []string, n int64) {
	s.total += n
	if v := s.domains[d] + n; v != 0 {
		s.domains[d] = v
	} else {
		delete(s.domains, d)
	}
	for _, g := range gs {
		if v := s.groups[g] + n; v != 0 {
			s.groups[g] = v
		} else {
			delete(s.groups, g)
		}
	}
}

func (s *State) lower(at int64) {
	if at < s.next {
		s.next = at
	}
}

// putHold inserts h and indexes it by session.
func (s *State) putHold(h *hold) {
	s.holds[h.id] = h
	if h.session != "" {
		m := s.sessions[h.session]
		if m == nil {
			m = map[string]struct{}{}
			s.sessions[h.session] = m
		}
		m[h.id] = struct{}{}
	}
	s.lower(h.expires)
}

// rebind moves h to session in the session index.
func (s *State) rebind(h *hold, session string) {
	if h.session != "" {
		m := s.sessions[h.session]
		delete(m, h.id)
		if len(m) == 0 {
			delete(s.sessions, h.session)
		}
	}
	h.session = session
	s.putHold(h)
}

// dropHold removes h (not its copies from the counts) and, when its
// reservation record has expired, the record.
func (s *State) dropHold(h *hold, t int64) {
	delete(s.holds, h.id)
	if h.session != "" {
		m := s.sessions[h.session]
		delete(m, h.id)
		if len(m) == 0 {
			delete(s.sessions, h.session)
		}
	}
	if h.requestID != "" {
		if r := s.records[h.requestID]; r != nil && r.holdID == h.id && r.expires <= t {
			delete(s.records, h.requestID)
		}
	}
}

// reap releases every hold whose lease lapsed at or before t, every staged
// transfer whose ttl lapsed, and every reservation record past its expiry
// whose hold is gone.
func (s *State) reap(t int64) Reaped {
	var r Reaped
	if s.holds == nil || t < s.next {
		return r
	}
	next := never
	for _, h := range s.holds {
		if h.expires <= t {
			s.add(h.domain, h.groups, -h.copies)
			s.dropHold(h, t)
			r.Holds++
			r.Copies += h.copies
		} else if h.expires < next {
			next = h.expires
		}
	}
	for id, x := range s.transfers {
		if x.expires <= t {
			s.add(x.domain, x.groups, -x.copies)
			delete(s.transfers, id)
			r.Transfers++
			r.Copies += x.copies
		} else if x.expires < next {
			next = x.expires
		}
	}
	for id, rec := range s.records {
		if _, live := s.holds[rec.holdID]; live {
			if rec.expires > t && rec.expires < next {
				next = rec.expires
			}
			continue
		}
		if rec.expires <= t {
			delete(s.records, id)
		} else if rec.expires < next {
			next = rec.expires
		}
	}
	s.next = next
	return r
}
