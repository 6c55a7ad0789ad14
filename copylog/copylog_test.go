package copylog

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Unix(1_700_000_000, 0)

func at(ms int64) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// checkCounts verifies that the counts are the sums over holds and
// transfers.
func checkCounts(t *testing.T, s *State) {
	t.Helper()
	dom, grp := map[string]int64{}, map[string]int64{}
	var total int64
	count := func(d string, gs []string, n int64) {
		dom[d] += n
		total += n
		for _, g := range gs {
			grp[g] += n
		}
	}
	for _, h := range s.Holds() {
		if h.Copies < 1 {
			t.Errorf("hold %s has %d copies", h.ID, h.Copies)
		}
		count(h.Domain, h.Groups, h.Copies)
	}
	for _, x := range s.Transfers() {
		count(x.Domain, x.Groups, x.Copies)
	}
	if total != s.TotalHeld() {
		t.Errorf("total held %d, sum over holds %d", s.TotalHeld(), total)
	}
	for d, n := range dom {
		if s.DomainHeld(d) != n {
			t.Errorf("domain %q held %d, sum %d", d, s.DomainHeld(d), n)
		}
	}
	for g, n := range grp {
		if s.GroupHeld(g) != n {
			t.Errorf("group %q held %d, sum %d", g, s.GroupHeld(g), n)
		}
	}
	if len(dom) != len(s.domains) || len(grp) != len(s.groups) {
		t.Errorf("count maps %v %v, sums %v %v", s.domains, s.groups, dom, grp)
	}
}

var bulkheads = &Config{
	DomainLimit: 5,
	GlobalLimit: 10,
	Groups: []Group{
		{Name: "big", Limit: 6, Members: []string{"a", "b"}},
		{Name: "probation", Limit: 2, Members: []string{"b", "c"}},
	},
	Overrides: map[string]int64{"vip": 8},
}

func TestReserveLimits(t *testing.T) {
	type held struct {
		domain string
		copies int64
	}
	tests := []struct {
		name     string
		held     []held
		domain   string
		copies   int64
		min      int64
		want     int64
		by       string
		ctx      Context
		wantHeld int64
	}{
		{name: "free", domain: "a", copies: 3, want: 3,
			ctx: Context{DomainLimit: 5, GlobalLimit: 10, DomainHeld: 3, TotalHeld: 3, Groups: []GroupContext{{"big", 6, 3}}}},
		{name: "domain limit", domain: "x", copies: 7, want: 5, by: "domain",
			ctx: Context{DomainLimit: 5, GlobalLimit: 10, DomainHeld: 5, TotalHeld: 5}},
		{name: "override", domain: "vip", copies: 9, want: 8, by: "domain",
			ctx: Context{DomainLimit: 8, GlobalLimit: 10, DomainHeld: 8, TotalHeld: 8}},
		{name: "group limit", held: []held{{"a", 4}, {"c", 1}}, domain: "b", copies: 3, want: 1, by: "probation",
			ctx: Context{DomainLimit: 5, GlobalLimit: 10, DomainHeld: 1, TotalHeld: 6,
				Groups: []GroupContext{{"big", 6, 5}, {"probation", 2, 2}}}},
		{name: "first of equals", held: []held{{"a", 4}}, domain: "b", copies: 3, want: 2, by: "big",
			ctx: Context{DomainLimit: 5, GlobalLimit: 10, DomainHeld: 2, TotalHeld: 6,
				Groups: []GroupContext{{"big", 6, 6}, {"probation", 2, 2}}}},
		{name: "big group", held: []held{{"a", 5}}, domain: "b", copies: 2, want: 1, by: "big",
			ctx: Context{DomainLimit: 5, GlobalLimit: 10, DomainHeld: 1, TotalHeld: 6,
				Groups: []GroupContext{{"big", 6, 6}, {"probation", 2, 1}}}},
		{name: "global limit", held: []held{{"x", 5}, {"y", 4}}, domain: "z", copies: 3, want: 1, by: "global",
			ctx: Context{DomainLimit: 5, GlobalLimit: 10, DomainHeld: 1, TotalHeld: 10}},
		{name: "min not met", held: []held{{"x", 5}, {"y", 4}}, domain: "z", copies: 3, min: 2, want: 0, by: "global",
			ctx: Context{DomainLimit: 5, GlobalLimit: 10, DomainHeld: 0, TotalHeld: 9}},
		{name: "full", held: []held{{"c", 2}}, domain: "b", copies: 1, want: 0, by: "probation",
			ctx: Context{DomainLimit: 5, GlobalLimit: 10, DomainHeld: 0, TotalHeld: 2,
				Groups: []GroupContext{{"big", 6, 0}, {"probation", 2, 2}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &State{}
			for i, h := range tt.held {
				r, err := Reserve(bulkheads, s, at(0), ReserveRequest{Domain: h.domain, Copies: h.copies, Min: h.copies,
					HoldID: "pre" + string(rune('0'+i)), Lease: time.Minute})
				if err != nil || !r.OK {
					t.Fatalf("setup reserve %v: %+v, %v", h, r, err)
				}
			}
			before := s.Holds()
			r, err := Reserve(bulkheads, s, at(1), ReserveRequest{Domain: tt.domain, Copies: tt.copies, Min: tt.min,
				HoldID: "h", Session: "s", Lease: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if r.Granted != tt.want || r.OK != (tt.want > 0) {
				t.Errorf("granted %d (ok %v), want %d", r.Granted, r.OK, tt.want)
			}
			by := ""
			switch {
			case r.LimitedByDomain:
				by = "domain"
			case r.LimitedByGlobal:
				by = "global"
			default:
				by = r.LimitedByGroup
			}
			if by != tt.by {
				t.Errorf("limited by %q, want %q", by, tt.by)
			}
			if diff := cmp.Diff(tt.ctx, r.Context); diff != "" {
				t.Errorf("context (-want +got):\n%s", diff)
			}
			if !r.OK {
				if diff := cmp.Diff(before, s.Holds()); diff != "" {
					t.Errorf("rejection changed holds:\n%s", diff)
				}
			}
			checkCounts(t, s)
		})
	}
}

// step is one operation of a scenario at a fixed instant.
type step struct {
	ms   int64
	op   func(s *State, now time.Time) (any, error)
	want any
	err  error
}

// runSteps runs steps in order on a new State and returns it.
func runSteps(t *testing.T, steps []step) *State {
	t.Helper()
	s := &State{}
	for i, st := range steps {
		got, err := st.op(s, at(st.ms))
		if !errors.Is(err, st.err) || (err != nil && st.err == nil) {
			t.Fatalf("step %d at %dms: error %v, want %v", i, st.ms, err, st.err)
		}
		if st.want != nil {
			if diff := cmp.Diff(st.want, got); diff != "" {
				t.Fatalf("step %d at %dms (-want +got):\n%s", i, st.ms, diff)
			}
		}
		checkCounts(t, s)
	}
	return s
}

var single = &Config{DomainLimit: 10, GlobalLimit: 10, Groups: []Group{{Name: "g", Limit: 4, Members: []string{"a"}}}}

func reserve(d, id, req, session string, k, m int64, lease time.Duration) func(*State, time.Time) (any, error) {
	return func(s *State, now time.Time) (any, error) {
		r, err := Reserve(single, s, now, ReserveRequest{Domain: d, Copies: k, Min: m, HoldID: id, RequestID: req,
			Session: session, Lease: lease})
		return [3]any{r.OK, r.Granted, r.HoldID}, err
	}
}

func release(id string, c int64) func(*State, time.Time) (any, error) {
	return func(s *State, now time.Time) (any, error) {
		r, err := Release(s, now, id, c)
		return [2]int64{r.Released, r.Left}, err
	}
}

func keepAlive(session, id string, lease time.Duration) func(*State, time.Time) (any, error) {
	return func(s *State, now time.Time) (any, error) {
		r, err := KeepAlive(s, now, session, id, lease)
		return [2]any{r.Holds, r.Expires}, err
	}
}

func releaseSession(session string) func(*State, time.Time) (any, error) {
	return func(s *State, now time.Time) (any, error) {
		r, err := ReleaseSession(s, now, session)
		return [2]any{r.Holds, r.Copies}, err
	}
}

func held(d string, want int64) step {
	return step{op: func(s *State, _ time.Time) (any, error) { return s.DomainHeld(d), nil }, want: want}
}

func heldAt(ms int64, d string, want int64) step {
	return step{ms: ms, op: func(s *State, now time.Time) (any, error) {
		_, err := Expire(s, now)
		return s.DomainHeld(d), err
	}, want: want}
}

func TestPartialRelease(t *testing.T) {
	runSteps(t, []step{
		{op: reserve("x", "h1", "", "", 7, 1, time.Minute), want: [3]any{true, int64(7), "h1"}},
		{op: release("h1", 2), want: [2]int64{2, 5}},
		{op: release("h1", 6), err: ErrOverRelease},
		{op: release("h1", 3), want: [2]int64{3, 2}},
		held("x", 2),
		{op: release("h1", 0), want: [2]int64{2, 0}},
		{op: release("h1", 1), err: ErrUnknownHold},
		{op: release("nope", 1), err: ErrUnknownHold},
		{op: release("", 1), err: ErrBadID},
		{op: release("h1", -1), err: ErrBadCopies},
		held("x", 0),
	})
}

func TestLeases(t *testing.T) {
	s := runSteps(t, []step{
		{op: reserve("a", "h1", "", "s1", 2, 2, time.Second), want: [3]any{true, int64(2), "h1"}},
		{ms: 500, op: reserve("a", "h2", "", "s1", 2, 2, time.Second), want: [3]any{true, int64(2), "h2"}},
		{ms: 600, op: reserve("a", "h3", "", "s2", 1, 1, time.Second), want: [3]any{false, int64(0), ""}},
		heldAt(999, "a", 4),
		// h1 lapses exactly at 1000 ms.
		heldAt(1000, "a", 2),
		{ms: 1200, op: keepAlive("s1", "", 2*time.Second), want: [2]any{1, at(3200)}},
		heldAt(3199, "a", 2),
		{ms: 3200, op: func(s *State, now time.Time) (any, error) {
			r, err := Reserve(single, s, now, ReserveRequest{Domain: "a", Copies: 4, HoldID: "h4", Lease: time.Second})
			return [2]any{r.Granted, r.Reaped}, err
		}, want: [2]any{int64(4), Reaped{Holds: 1, Copies: 2}}},
		{ms: 3300, op: keepAlive("", "h4", 100*time.Millisecond), want: [2]any{1, at(4200)}}, // never shortened: it stays 4200
		{ms: 3300, op: keepAlive("", "h1", time.Second), err: ErrUnknownHold},
		{ms: 3300, op: keepAlive("", "", time.Second), err: ErrBadID},
		{ms: 3300, op: keepAlive("s1", "", 0), err: ErrBadLease},
		heldAt(4200, "a", 0),
	})
	if !s.Empty() || s.Token() != 3 {
		t.Errorf("empty %v token %d, want true 3", s.Empty(), s.Token())
	}
}

func TestSessionRelease(t *testing.T) {
	runSteps(t, []step{
		{op: reserve("a", "h1", "", "s1", 2, 2, time.Minute)},
		{op: reserve("b", "h2", "", "s1", 3, 3, time.Minute)},
		{op: reserve("b", "h3", "", "s2", 1, 1, time.Minute)},
		{op: func(s *State, now time.Time) (any, error) {
			r, err := Transfer(s, now, "h2", 1, time.Second, "x1")
			return r.Left, err
		}, want: int64(2)},
		{ms: 1, op: releaseSession("s1"), want: [2]any{2, int64(4)}},
		held("a", 0),
		held("b", 2), // h3 and the staged copy
		{ms: 2, op: releaseSession("s1"), want: [2]any{0, int64(0)}},
		{ms: 2, op: releaseSession(""), err: ErrBadID},
		heldAt(1000, "b", 1),
	})
}

func TestTransferSeize(t *testing.T) {
	transfer := func(id string, c int64, ttl time.Duration, x string) func(*State, time.Time) (any, error) {
		return func(s *State, now time.Time) (any, error) {
			r, err := Transfer(s, now, id, c, ttl, x)
			return [2]int64{r.Copies, r.Left}, err
		}
	}
	seize := func(x, id, session string) func(*State, time.Time) (any, error) {
		return func(s *State, now time.Time) (any, error) {
			r, err := Seize(s, now, x, id, session, time.Minute)
			return SeizeResult{HoldID: r.HoldID, Copies: r.Copies, Token: r.Token, Domain: r.Domain, Groups: r.Groups}, err
		}
	}
	runSteps(t, []step{
		// Paper Figure 6: 15 copies, 10 staged, 5 released by each side.
		{op: reserve("a", "h1", "", "s1", 4, 4, time.Minute), want: [3]any{true, int64(4), "h1"}},
		{op: transfer("h1", 3, 30*time.Second, "x1"), want: [2]int64{3, 1}},
		{op: transfer("h1", 2, 30*time.Second, "x2"), err: ErrOverTransfer},
		{op: transfer("h1", 1, 30*time.Second, "x1"), err: ErrTransferExists},
		{op: transfer("h1", 1, 0, "x2"), err: ErrBadLease},
		{op: transfer("h1", 1, time.Second, ""), err: ErrBadID},
		{op: release("h1", 2), err: ErrOverRelease},
		held("a", 4),
		// Staged copies still count: the group (limit 4) is full.
		{op: reserve("a", "h9", "", "", 1, 1, time.Minute), want: [3]any{false, int64(0), ""}},
		{ms: 10, op: seize("x1", "h2", "s2"), want: SeizeResult{HoldID: "h2", Copies: 3, Token: 2, Domain: "a", Groups: []string{"g"}}},
		{ms: 10, op: seize("x1", "h3", "s2"), err: ErrUnknownTransfer},
		{ms: 10, op: release("h2", 2), want: [2]int64{2, 1}},
		{ms: 10, op: release("h1", 0), want: [2]int64{1, 0}},
		held("a", 1),
		// A transfer of everything removes the hold; an unseized one lapses.
		{ms: 20, op: transfer("h2", 0, time.Second, "x3"), want: [2]int64{1, 0}},
		{ms: 20, op: release("h2", 1), err: ErrUnknownHold},
		heldAt(1019, "a", 1),
		{ms: 1020, op: seize("x3", "h4", ""), err: ErrUnknownTransfer},
		held("a", 0),
	})
}

func TestIdempotentReserve(t *testing.T) {
	s := runSteps(t, []step{
		{op: reserve("a", "h1", "q1", "s1", 3, 1, time.Second), want: [3]any{true, int64(3), "h1"}},
		// The retry, from a new session, with a fresh hold id: the same hold.
		{ms: 500, op: reserve("a", "h2", "q1", "s2", 3, 1, time.Second), want: [3]any{true, int64(3), "h1"}},
		held("a", 3),
		{ms: 500, op: reserve("b", "h2", "q1", "s2", 3, 1, time.Second), err: ErrRequestIDReused},
		// The hold moved to s2 and was refreshed to 1500 ms.
		{ms: 600, op: releaseSession("s1"), want: [2]any{0, int64(0)}},
		heldAt(1499, "a", 3),
		{ms: 1499, op: release("h1", 0)},
		// Released, but the record lives until 1500 ms: no new grant, the
		// answer says the hold is gone, and the retry keeps the record
		// until 2499 ms.
		{ms: 1499, op: reserve("a", "h3", "q1", "", 3, 1, time.Second), want: [3]any{false, int64(0), "h1"}},
		held("a", 0),
		{ms: 2498, op: reserve("a", "h3", "q1", "", 3, 1, time.Millisecond), want: [3]any{false, int64(0), "h1"}},
		{ms: 2499, op: reserve("a", "h3", "q1", "", 3, 1, time.Second), want: [3]any{true, int64(3), "h3"}},
	})
	r, _ := Reserve(single, s, at(2600), ReserveRequest{Domain: "a", Copies: 1, HoldID: "h5", RequestID: "q1", Lease: time.Second})
	if !r.Replayed || r.Token != 2 || r.HoldID != "h3" {
		t.Errorf("replay %+v, want hold h3 token 2 replayed", r)
	}
}

func TestArgumentErrors(t *testing.T) {
	s := &State{}
	ok := ReserveRequest{Domain: "a", Copies: 1, HoldID: "h", Lease: time.Second}
	tests := []struct {
		name string
		cfg  *Config
		mod  func(*ReserveRequest)
		err  error
	}{
		{"nil config", nil, nil, ErrBadConfig},
		{"negative limit", &Config{DomainLimit: -1}, nil, ErrBadConfig},
		{"huge limit", &Config{GlobalLimit: MaxCopies + 1}, nil, ErrBadConfig},
		{"bad override", &Config{Overrides: map[string]int64{"a": -2}}, nil, ErrBadConfig},
		{"unnamed group", &Config{Groups: []Group{{Limit: 1}}}, nil, ErrBadConfig},
		{"twice", &Config{Groups: []Group{{Name: "g"}, {Name: "g"}}}, nil, ErrBadConfig},
		{"zero copies", single, func(r *ReserveRequest) { r.Copies = 0 }, ErrBadCopies},
		{"too many", single, func(r *ReserveRequest) { r.Copies = MaxCopies + 1 }, ErrBadCopies},
		{"min above", single, func(r *ReserveRequest) { r.Min = 2 }, ErrBadMin},
		{"min negative", single, func(r *ReserveRequest) { r.Min = -1 }, ErrBadMin},
		{"no lease", single, func(r *ReserveRequest) { r.Lease = 0 }, ErrBadLease},
		{"long lease", single, func(r *ReserveRequest) { r.Lease = MaxLease + time.Microsecond }, ErrBadLease},
		{"no hold id", single, func(r *ReserveRequest) { r.HoldID = "" }, ErrBadID},
		{"long domain", single, func(r *ReserveRequest) { r.Domain = string(make([]byte, MaxIDLen+1)) }, ErrBadID},
	}
	for _, tt := range tests {
		r := ok
		if tt.mod != nil {
			tt.mod(&r)
		}
		if _, err := Reserve(tt.cfg, s, t0, r); !errors.Is(err, tt.err) {
			t.Errorf("%s: error %v, want %v", tt.name, err, tt.err)
		}
	}
	if !s.Empty() || s.Token() != 0 {
		t.Errorf("errors changed the state")
	}
	if _, err := Reserve(single, nil, t0, ok); !errors.Is(err, ErrNilState) {
		t.Errorf("nil state: %v", err)
	}
	if _, err := Reserve(single, s, t0, ok); err != nil {
		t.Fatal(err)
	}
	if _, err := Reserve(single, s, t0, ok); !errors.Is(err, ErrHoldExists) {
		t.Errorf("same hold id: %v, want ErrHoldExists", err)
	}
	if _, err := Seize(s, t0, "x", "h", "", time.Second); !errors.Is(err, ErrUnknownTransfer) {
		t.Errorf("seize unknown: %v", err)
	}
	if _, err := Transfer(s, t0, "h", 1, time.Second, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := Reserve(single, s, t0, ok); err != nil { // the id is free again
		t.Fatal(err)
	}
	if _, err := Seize(s, t0, "x", "h", "", time.Second); !errors.Is(err, ErrHoldExists) {
		t.Errorf("seize onto a used id: %v, want ErrHoldExists", err)
	}
	for name, f := range map[string]func() error{
		"Release":        func() error { _, err := Release(nil, t0, "h", 1); return err },
		"Transfer":       func() error { _, err := Transfer(nil, t0, "h", 1, time.Second, "x"); return err },
		"Seize":          func() error { _, err := Seize(nil, t0, "x", "h", "", time.Second); return err },
		"KeepAlive":      func() error { _, err := KeepAlive(nil, t0, "s", "", time.Second); return err },
		"ReleaseSession": func() error { _, err := ReleaseSession(nil, t0, "s"); return err },
		"Expire":         func() error { _, err := Expire(nil, t0); return err },
	} {
		if err := f(); !errors.Is(err, ErrNilState) {
			t.Errorf("%s(nil): %v", name, err)
		}
	}
}

// Groups are captured at reserve time: a release after the domain left a
// group gives the copies back to that group's pool.
func TestGroupsCaptured(t *testing.T) {
	s := &State{}
	before := &Config{DomainLimit: 5, Groups: []Group{{Name: "trial", Limit: 2, Members: []string{"a"}}}}
	after := &Config{DomainLimit: 5, Groups: []Group{{Name: "trial", Limit: 2}, {Name: "trusted", Limit: 5, Members: []string{"a"}}}}
	if r, _ := Reserve(before, s, t0, ReserveRequest{Domain: "a", Copies: 2, HoldID: "h1", Lease: time.Minute}); r.Granted != 2 {
		t.Fatalf("granted %d", r.Granted)
	}
	r, _ := Reserve(after, s, t0, ReserveRequest{Domain: "a", Copies: 5, HoldID: "h2", Lease: time.Minute})
	if r.Granted != 3 || !r.LimitedByDomain || cmp.Diff([]string{"trusted"}, r.Groups) != "" {
		t.Errorf("after the move: %+v", r)
	}
	if _, err := Release(s, t0, "h1", 2); err != nil {
		t.Fatal(err)
	}
	if s.GroupHeld("trial") != 0 || s.GroupHeld("trusted") != 3 {
		t.Errorf("trial %d trusted %d, want 0 3", s.GroupHeld("trial"), s.GroupHeld("trusted"))
	}
	checkCounts(t, s)
}

func TestSeedAndNextExpiry(t *testing.T) {
	s := &State{}
	if !s.NextExpiry().IsZero() {
		t.Errorf("zero state next expiry %v", s.NextExpiry())
	}
	s.Seed(41)
	s.Seed(7)
	r, _ := Reserve(single, s, t0, ReserveRequest{Domain: "a", Copies: 1, HoldID: "h", Lease: time.Second})
	if r.Token != 42 {
		t.Errorf("token %d, want 42", r.Token)
	}
	if got := s.NextExpiry(); !got.Equal(t0.Add(time.Second)) {
		t.Errorf("next expiry %v", got)
	}
}
