// Package pooltest is the contract every escrow.Pool meets, run against
// the memory pool and the Redis pool.
package pooltest

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/escrow"
)

// Run checks the contract on pools newPool returns; wait lets d pass on
// the pool's clock (a fake clock's step, or a real wait for Redis's).
func Run(t *testing.T, newPool func(t *testing.T) (p escrow.Pool, wait func(time.Duration))) {
	ctx := context.Background()
	t.Run("TakeFromTheSliceThatEndsFirst", func(t *testing.T) {
		p, _ := newPool(t)
		k := "d\x00res{with}braces\x007"
		if n, id, st, err := p.Take(ctx, k, 5, 0); err != nil || n != 0 || id != 0 || st.Left != 0 {
			t.Fatalf("empty pool: Take = %d, %d, %+v, %v; want nothing", n, id, st, err)
		}
		_, _, st, _ := p.Take(ctx, k, 0, 0)
		must(t, p.Add(ctx, k, 1, 10, st.At.Add(10*time.Second)))
		must(t, p.Add(ctx, k, 2, 5, st.At.Add(20*time.Second)))
		n, id, st, err := p.Take(ctx, k, 4, 0)
		if err != nil || n != 4 || id != 1 || st.Left != 11 {
			t.Fatalf("Take(4) = %d, %d, %+v, %v; want 4 from slice 1, 11 left", n, id, st, err)
		}
		// Only slice 2 stays open 15s more.
		n, id, st, err = p.Take(ctx, k, 20, 15*time.Second)
		if err != nil || n != 5 || id != 2 || st.Left != 0 {
			t.Fatalf("Take(20, open 15s) = %d, %d, %+v, %v; want 5 from slice 2, 0 left", n, id, st, err)
		}
		if st.Open < 15*time.Second || st.Open > 20*time.Second {
			t.Errorf("Open = %v, want the last slice's 20s less the time passed", st.Open)
		}
		// Another pair is another pool.
		if n, _, _, _ := p.Take(ctx, "d\x00res{with}other\x007", 5, 0); n != 0 {
			t.Errorf("another pair took %d hits of this one's slices", n)
		}
	})
	t.Run("PutWhileOpenCloseOnce", func(t *testing.T) {
		p, _ := newPool(t)
		k := "pair"
		_, _, st, _ := p.Take(ctx, k, 0, 0)
		must(t, p.Add(ctx, k, 7, 10, st.At.Add(10*time.Second)))
		if n, _, _, _ := p.Take(ctx, k, 6, 0); n != 6 {
			t.Fatalf("took %d, want 6", n)
		}
		if ok, err := p.Put(ctx, k, 7, 3); err != nil || !ok {
			t.Fatalf("Put into an open slice = %v, %v; want true", ok, err)
		}
		if _, _, st, _ := p.Take(ctx, k, 0, 0); st.Left != 7 {
			t.Fatalf("after the put: %+v, want 7 left", st)
		}
		if n, err := p.Close(ctx, k, 7); err != nil || n != 7 {
			t.Fatalf("Close = %d, %v; want the 7 left", n, err)
		}
		if n, err := p.Close(ctx, k, 7); err != nil || n != 0 {
			t.Fatalf("Close again = %d, %v; want 0: a slice's rest is given back once", n, err)
		}
		if ok, err := p.Put(ctx, k, 7, 2); err != nil || ok {
			t.Fatalf("Put into a closed slice = %v, %v; want false (the caller gives to the home)", ok, err)
		}
		if n, _, _, _ := p.Take(ctx, k, 5, 0); n != 0 {
			t.Fatalf("took %d from a closed slice", n)
		}
	})
	t.Run("AddToAnOpenSlice", func(t *testing.T) {
		p, _ := newPool(t)
		k := "twice"
		_, _, st, _ := p.Take(ctx, k, 0, 0)
		must(t, p.Add(ctx, k, 3, 4, st.At.Add(5*time.Second)))
		must(t, p.Add(ctx, k, 3, 6, st.At.Add(10*time.Second)))
		n, id, st2, err := p.Take(ctx, k, 100, 8*time.Second)
		if err != nil || n != 10 || id != 3 || st2.Left != 0 {
			t.Fatalf("Take after two Adds of one slice = %d, %d, %+v, %v; want all 10 hits, open past 8s", n, id, st2, err)
		}
		if n, err := p.Close(ctx, k, 3); err != nil || n != 0 {
			t.Fatalf("Close = %d, %v; want 0 left", n, err)
		}
	})
	t.Run("EndedSlices", func(t *testing.T) {
		p, wait := newPool(t)
		k := "ended"
		_, _, st, _ := p.Take(ctx, k, 0, 0)
		// An Add that arrives after its end opens nothing.
		must(t, p.Add(ctx, k, 1, 10, st.At.Add(-time.Millisecond)))
		if n, _, st, _ := p.Take(ctx, k, 5, 0); n != 0 || st.Left != 0 {
			t.Fatalf("a slice added after its end: took %d, %+v", n, st)
		}
		must(t, p.Add(ctx, k, 2, 10, st.At.Add(300*time.Millisecond)))
		if n, _, _, _ := p.Take(ctx, k, 1, 0); n != 1 {
			t.Fatalf("took %d from an open slice, want 1", n)
		}
		wait(400 * time.Millisecond)
		if n, _, st, _ := p.Take(ctx, k, 5, 0); n != 0 || st.Left != 0 {
			t.Fatalf("took %d from an ended slice (%+v)", n, st)
		}
		if ok, _ := p.Put(ctx, k, 2, 1); ok {
			t.Fatal("a put into an ended slice was taken: its rest may have gone to the home already")
		}
		// Its opener still closes it, and gets its rest.
		if n, err := p.Close(ctx, k, 2); err != nil || n != 9 {
			t.Fatalf("Close of an ended slice = %d, %v; want its 9", n, err)
		}
	})
	t.Run("Refusal", func(t *testing.T) {
		p, _ := newPool(t)
		for _, r := range []escrow.Refusal{{Retry: 300 * time.Millisecond, Hard: true}, {Retry: math.MaxInt64, Global: true}} {
			k := "refused" + r.Retry.String()
			must(t, p.Refuse(ctx, k, 10*time.Second, r))
			_, _, st, err := p.Take(ctx, k, 1, 0)
			if err != nil || st.Refused <= 9*time.Second || st.Refused > 10*time.Second || st.Refusal != r {
				t.Fatalf("after Refuse(%+v): %+v, %v", r, st, err)
			}
		}
		if _, _, st, _ := p.Take(ctx, "not refused", 1, 0); st.Refused != 0 {
			t.Fatalf("a pair never refused: %+v", st)
		}
	})
	t.Run("Demand", func(t *testing.T) {
		p, wait := newPool(t)
		k := "demand"
		if sum, err := p.Report(ctx, k, "a", 120.5, time.Second); err != nil || sum != 120.5 {
			t.Fatalf("Report(a) = %v, %v; want 120.5", sum, err)
		}
		if sum, _ := p.Report(ctx, k, "b", 30, time.Second); sum != 150.5 {
			t.Fatalf("Report(b) = %v, want a's and b's: 150.5", sum)
		}
		if sum, _ := p.Report(ctx, k, "a", 20, time.Second); sum != 50 {
			t.Fatalf("a's second report = %v, want it to replace its first: 50", sum)
		}
		if sum, _ := p.Report(ctx, k, "b", 0, time.Second); sum != 20 {
			t.Fatalf("b withdrawn: %v, want 20", sum)
		}
		if sum, _ := p.Report(ctx, "another", "c", 7, time.Second); sum != 7 {
			t.Fatalf("another pair: %v, want its own 7", sum)
		}
		wait(300 * time.Millisecond)
		if sum, _ := p.Report(ctx, k, "c", 1, 200*time.Millisecond); sum != 1 {
			t.Fatalf("a's report is older than the ttl: %v, want c's 1 alone", sum)
		}
	})
	t.Run("Lock", func(t *testing.T) {
		p, _ := newPool(t)
		k := "locked"
		if ok, err := p.Lock(ctx, k, "a", 10*time.Second); err != nil || !ok {
			t.Fatalf("Lock(a) = %v, %v", ok, err)
		}
		if ok, _ := p.Lock(ctx, k, "b", 10*time.Second); ok {
			t.Fatal("b took a's lock")
		}
		must(t, p.Unlock(ctx, k, "b"))
		if ok, _ := p.Lock(ctx, k, "b", 10*time.Second); ok {
			t.Fatal("b's Unlock released a's lock")
		}
		must(t, p.Unlock(ctx, k, "a"))
		if ok, _ := p.Lock(ctx, k, "b", 10*time.Second); !ok {
			t.Fatal("a's lock was not released")
		}
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
