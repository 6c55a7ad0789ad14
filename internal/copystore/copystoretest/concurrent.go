package copystoretest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/internal/copystore"
)

// abcConfig is the shape of the concurrent tests' configurations: domains
// a, b and c (concDomains) of domainLimit each, a and b in group ab of
// abLimit, c overridden to cLimit, all within globalLimit.
func abcConfig(domainLimit, abLimit, cLimit, globalLimit int64) *copylog.Config {
	return &copylog.Config{
		DomainLimit: domainLimit,
		GlobalLimit: globalLimit,
		Groups:      []copylog.Group{{Name: "ab", Limit: abLimit, Members: []string{"a", "b"}}},
		Overrides:   map[string]int64{"c": cLimit},
	}
}

var concDomains = []string{"a", "b", "c"}

// concCfg is the configuration of testConcurrentLimits.
var concCfg = abcConfig(6, 8, 4, 10)

// pools tracks, from the workers' side, the copies they hold per domain,
// in group ab and in all. A worker adds a grant after it returns and
// subtracts a release before it starts, so the tracked copies never exceed
// what the store counts, and must stay within the limits.
type pools struct {
	domain map[string]*atomic.Int64
	ab     atomic.Int64
	total  atomic.Int64
}

func newPools() *pools {
	p := &pools{domain: map[string]*atomic.Int64{}}
	for _, d := range concDomains {
		p.domain[d] = new(atomic.Int64)
	}
	return p
}

// add counts n copies of domain d (n < 0: fewer) and reports a limit
// exceeded.
func (p *pools) add(d string, n int64) error {
	dv := p.domain[d].Add(n)
	tv := p.total.Add(n)
	var gv int64
	if d != "c" {
		gv = p.ab.Add(n)
	}
	lim := concCfg.DomainLimit
	if v, ok := concCfg.Overrides[d]; ok {
		lim = v
	}
	if n > 0 && (dv > lim || tv > concCfg.GlobalLimit || gv > concCfg.Groups[0].Limit) {
		return fmt.Errorf("%s now holds %d (limit %d), ab %d (limit %d), all %d (limit %d)", d, dv, lim, gv, concCfg.Groups[0].Limit, tv, concCfg.GlobalLimit)
	}
	return nil
}

type staged struct {
	id, domain string
	copies     int64
}

// testConcurrentLimits runs workers that reserve, release in part or in
// full, transfer to each other, seize and end their sessions on one
// resource, and checks that no limit is ever exceeded: in the answers'
// contexts and in the copies the workers hold.
func testConcurrentLimits(t *testing.T, s copystore.Store) {
	const workers, ops = 8, 150
	res := Resource("concurrent")
	p := newPools()
	transfers := make(chan staged, workers*ops)
	var granted, rejected atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			errs <- concWorker(s, res, w, ops, p, transfers, &granted, &rejected)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if granted.Load() == 0 || rejected.Load() == 0 {
		t.Errorf("%d grants, %d rejections: the test should see both", granted.Load(), rejected.Load())
	}
	// Seize and release what is still staged: then everything is free.
	close(transfers)
	for x := range transfers {
		h, err := s.Seize(ctx, T0, res, x.id, newID("h"), "", Lease)
		if err != nil {
			t.Fatalf("seize of a leftover transfer: %v", err)
		}
		release(t, s, T0, res, h.HoldID, 0)
	}
	r := grant(t, s, T0, res, concCfg, req("a", 6, 1), 6)
	if r.Context.TotalHeld != 6 {
		t.Errorf("after the workers: TotalHeld %d, want 6 (the workers' copies are all back)", r.Context.TotalHeld)
	}
	grant(t, s, T0, res, concCfg, req("c", 4, 1), 4)
}

type wHold struct {
	id, domain string
	copies     int64
}

func concWorker(s copystore.Store, res string, w, ops int, p *pools, transfers chan staged, granted, rejected *atomic.Int64) error {
	rng := rand.New(rand.NewPCG(uint64(w), 42))
	session := newID("s")
	var holds []wHold
	drop := func(i int) {
		holds[i] = holds[len(holds)-1]
		holds = holds[:len(holds)-1]
	}
	for range ops {
		switch op := rng.IntN(10); {
		case op < 4 || len(holds) == 0:
			d := concDomains[rng.IntN(len(concDomains))]
			k := int64(1 + rng.IntN(4))
			r := copylog.ReserveRequest{Domain: d, Copies: k, Min: int64(rng.IntN(int(k) + 1)), HoldID: newID("h"), Session: session, Lease: Lease}
			got, err := s.Reserve(ctx, T0, res, concCfg, r)
			if err != nil {
				return fmt.Errorf("worker %d: Reserve: %w", w, err)
			}
			c := got.Context
			if c.DomainHeld > c.DomainLimit || c.TotalHeld > c.GlobalLimit || len(c.Groups) > 0 && c.Groups[0].Held > c.Groups[0].Limit {
				return fmt.Errorf("worker %d: context over a limit: %+v", w, c)
			}
			if !got.OK {
				rejected.Add(1)
				continue
			}
			granted.Add(1)
			if got.Granted < max(r.Min, 1) || got.Granted > k {
				return fmt.Errorf("worker %d: granted %d of [%d, %d]", w, got.Granted, r.Min, k)
			}
			if err := p.add(d, got.Granted); err != nil {
				return fmt.Errorf("worker %d: %w", w, err)
			}
			holds = append(holds, wHold{got.HoldID, d, got.Granted})
		case op < 6:
			i := rng.IntN(len(holds))
			h := &holds[i]
			n := int64(rng.IntN(int(h.copies) + 1))
			if n == 0 {
				n = h.copies
			}
			p.add(h.domain, -n)
			got, err := s.Release(ctx, T0, res, h.id, n)
			if err != nil {
				return fmt.Errorf("worker %d: Release(%d of %d): %w", w, n, h.copies, err)
			}
			if h.copies -= n; got.Left != h.copies {
				return fmt.Errorf("worker %d: release left %d, want %d", w, got.Left, h.copies)
			}
			if h.copies == 0 {
				drop(i)
			}
		case op < 7:
			i := rng.IntN(len(holds))
			h := &holds[i]
			n := int64(1 + rng.IntN(int(h.copies)))
			x, err := s.Transfer(ctx, T0, res, h.id, n, Lease, newID("x"))
			if err != nil {
				return fmt.Errorf("worker %d: Transfer: %w", w, err)
			}
			transfers <- staged{x.TransferID, h.domain, n}
			if h.copies -= n; h.copies == 0 {
				drop(i)
			}
		case op < 9:
			select {
			case x := <-transfers:
				got, err := s.Seize(ctx, T0, res, x.id, newID("h"), session, Lease)
				if err != nil {
					return fmt.Errorf("worker %d: Seize: %w", w, err)
				}
				if got.Copies != x.copies || got.Domain != x.domain {
					return fmt.Errorf("worker %d: seized %d of %s, want %d of %s", w, got.Copies, got.Domain, x.copies, x.domain)
				}
				holds = append(holds, wHold{got.HoldID, x.domain, x.copies})
			default:
			}
		default:
			var want int64
			for _, h := range holds {
				p.add(h.domain, -h.copies)
				want += h.copies
			}
			got, err := s.ReleaseSession(ctx, T0, res, session)
			if err != nil {
				return fmt.Errorf("worker %d: ReleaseSession: %w", w, err)
			}
			if got.Holds != len(holds) || got.Copies != want {
				return fmt.Errorf("worker %d: session released %d holds, %d copies; want %d, %d", w, got.Holds, got.Copies, len(holds), want)
			}
			holds, session = holds[:0], newID("s")
		}
	}
	for _, h := range holds {
		p.add(h.domain, -h.copies)
		if _, err := s.Release(ctx, T0, res, h.id, 0); err != nil {
			return fmt.Errorf("worker %d: final Release: %w", w, err)
		}
	}
	return nil
}

// errKind names the copylog error err wraps, for histories.
func errKind(err error) string {
	for _, k := range []struct {
		err  error
		name string
	}{
		{copylog.ErrUnknownHold, "unknown hold"},
		{copylog.ErrUnknownTransfer, "unknown transfer"},
		{copylog.ErrOverRelease, "over-release"},
		{copylog.ErrOverTransfer, "over-transfer"},
		{copylog.ErrHoldExists, "hold exists"},
		{copylog.ErrTransferExists, "transfer exists"},
		{copylog.ErrRequestIDReused, "request id reused"},
	} {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	if err != nil {
		return "other: " + err.Error()
	}
	return ""
}
