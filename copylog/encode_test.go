package copylog

import (
	"fmt"
	"reflect"
	"testing"
	"time"
)

// TestEncodeRoundTrip replays one trace of every operation on a State kept
// in memory and on one encoded and decoded before every operation: every
// answer and error is the same, so a store may keep States outside the
// process.
func TestEncodeRoundTrip(t *testing.T) {
	cfg := &Config{DomainLimit: 4, GlobalLimit: 9, Groups: []Group{{Name: "eu", Limit: 5, Members: []string{"a", "b"}}}}
	var kept, wire State
	t0 := time.UnixMicro(1_900_000_000_000_000)
	roundTrip := func() {
		t.Helper()
		b, err := wire.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var next State
		if err := next.UnmarshalBinary(b); err != nil {
			t.Fatal(err)
		}
		wire = next
	}
	type op func(s *State, now time.Time) (any, error)
	holds := 0
	var ops []op
	for i := 0; i < 60; i++ {
		i := i
		dom := []string{"a", "b", "c"}[i%3]
		switch i % 6 {
		case 0, 1:
			holds++
			id := fmt.Sprintf("h%d", holds)
			ops = append(ops, func(s *State, now time.Time) (any, error) {
				return Reserve(cfg, s, now, ReserveRequest{Domain: dom, Copies: 3, Min: 1, HoldID: id,
					RequestID: fmt.Sprintf("q%d", i%5), Session: fmt.Sprintf("s%d", i%2), Lease: 3 * time.Second})
			})
		case 2:
			id := fmt.Sprintf("h%d", holds)
			ops = append(ops, func(s *State, now time.Time) (any, error) { return Release(s, now, id, 1) })
		case 3:
			id := fmt.Sprintf("h%d", holds)
			ops = append(ops, func(s *State, now time.Time) (any, error) {
				return Transfer(s, now, id, 1, 2*time.Second, fmt.Sprintf("t%d", i))
			})
		case 4:
			tid := fmt.Sprintf("t%d", i-1)
			ops = append(ops, func(s *State, now time.Time) (any, error) {
				return Seize(s, now, tid, fmt.Sprintf("z%d", i), "s1", 2*time.Second)
			})
		case 5:
			ops = append(ops, func(s *State, now time.Time) (any, error) {
				if i%12 == 5 {
					return ReleaseSession(s, now, "s0")
				}
				return KeepAlive(s, now, "s1", "", 4*time.Second)
			})
		}
	}
	staged := 0
	for i, o := range ops {
		now := t0.Add(time.Duration(i) * 700 * time.Millisecond)
		want, werr := o(&kept, now)
		roundTrip()
		got, gerr := o(&wire, now)
		if fmt.Sprint(werr) != fmt.Sprint(gerr) || !reflect.DeepEqual(normalize(want), normalize(got)) {
			t.Fatalf("op %d: kept %+v (%v), round-tripped %+v (%v)", i, want, werr, got, gerr)
		}
		view := func(s *State) string {
			return fmt.Sprint(s.TotalHeld(), s.DomainHeld("a"), s.DomainHeld("b"), s.DomainHeld("c"), s.GroupHeld("eu"),
				s.Holds(), s.Transfers(), s.Token())
		}
		if view(&kept) != view(&wire) {
			t.Fatalf("op %d: kept state %s, round-tripped %s", i, view(&kept), view(&wire))
		}
		if len(kept.Transfers()) > 0 {
			staged++
		}
	}
	if !reflect.DeepEqual(kept.Holds(), wire.Holds()) || kept.TotalHeld() != wire.TotalHeld() || kept.Token() != wire.Token() {
		t.Fatalf("end states differ")
	}
	if staged == 0 {
		t.Fatal("the trace never staged a transfer")
	}
	if kept.LastExpiry().IsZero() {
		t.Fatal("LastExpiry of a state with holds is zero")
	}
}

// normalize makes nil and empty slices compare equal.
func normalize(v any) string { return fmt.Sprintf("%+v", v) }
