package resilient

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// DefaultDebtInterval is how long the refused hits of a post-paid pair in
// debt are summed in the process before they are sent (Options.DebtInterval).
const DefaultDebtInterval = 20 * time.Millisecond

// debts are the refused hits of post-paid pairs in debt that the
// over-limit cache answered, summed per pair until they are sent: one
// remote call per pair per interval instead of one per refused request.
// Safe for concurrent use; the zero value is not usable (newDebts).
type debts struct {
	interval time.Duration
	flush    func() // the timer's: Store.flushDebts
	mu       sync.Mutex
	m        map[store.Key]*debt
	timer    *time.Timer // armed while m holds debits and no flush is due
	armed    bool
	closed   bool
	// flushing is held by a flush for its whole length: flushes run one at
	// a time, and Settle and Close wait for the one in flight.
	flushing sync.Mutex

	deferred, flushes, flushErrors atomic.Uint64
}

// debt is one pair's summed debits: item is the pair's post-paid group as
// one take (its key, policy, the hits summed, the minimum of the last
// request), at the instant of the last of them.
type debt struct {
	item store.Item
	at   time.Time
}

func newDebts(interval time.Duration) *debts {
	return &debts{interval: interval, m: map[store.Key]*debt{}}
}

// add sums the hits of the post-paid groups of items (whose Plan is plan),
// refused at now from the cache, and arms the flush timer if it is not
// armed. Items without such a group add nothing.
func (d *debts) add(now time.Time, plan *store.Plan, items []store.Item) {
	some := false
	for i := range items {
		hits, _ := plan.Sums(i)
		some = some || (plan.Leads(i) && plan.PostPaid(i) && hits > 0)
	}
	if !some {
		return
	}
	d.deferred.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range items {
		hits, min := plan.Sums(i)
		if !plan.Leads(i) || !plan.PostPaid(i) || hits == 0 {
			continue
		}
		it := &items[i]
		e := d.m[it.Key]
		if e == nil {
			k := store.Key{Resource: strings.Clone(it.Key.Resource), Domain: strings.Clone(it.Key.Domain), PolicyID: it.Key.PolicyID}
			e = &debt{item: store.Item{Key: k, Policy: it.Policy}}
			d.m[k] = e
		}
		e.item.Hits += hits
		e.item.Min = min
		e.item.Policy = it.Policy
		if now.After(e.at) {
			e.at = now
		}
	}
	d.arm()
}

// arm starts the timer unless it is armed or the debts are closed; d.mu is
// held.
func (d *debts) arm() {
	if d.armed || d.closed || len(d.m) == 0 {
		return
	}
	d.armed = true
	if d.timer == nil {
		d.timer = time.AfterFunc(d.interval, d.flush)
	} else {
		d.timer.Reset(d.interval)
	}
}

// take removes and returns the debits summed so far.
func (d *debts) take() []*debt {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.armed = false
	if len(d.m) == 0 {
		return nil
	}
	out := make([]*debt, 0, len(d.m))
	for _, e := range d.m {
		out = append(out, e)
	}
	clear(d.m)
	return out
}

// putBack returns the debits of e, which were not sent, to be sent with
// the next flush.
func (d *debts) putBack(e *debt) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if o := d.m[e.item.Key]; o != nil {
		o.item.Hits += e.item.Hits
		if e.at.After(o.at) {
			o.at = e.at
		}
		return
	}
	d.m[e.item.Key] = e
}

// flushDebts sends the summed debits, one remote call per pair, all at once
// (the Redis store batches them), and arms the timer again if debits came
// meanwhile or were put back. The timer calls it; Settle and Close too.
func (s *Store) flushDebts() {
	d := s.debts
	d.flushing.Lock()
	defer d.flushing.Unlock()
	batch := d.take()
	var wg sync.WaitGroup
	for _, e := range batch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.sendDebt(e)
		}()
	}
	wg.Wait()
	d.mu.Lock()
	d.arm()
	d.mu.Unlock()
}

// sendDebt sends one pair's summed debits as a take of a post-paid item,
// which the remote debits whatever its answer, and caches the answer: a
// rejection valid until the debt, now larger, is repaid, or, if the pair
// has room again, no entry. Debits that certainly did not reach the remote
// (breaker open, not sent in time) are put back for the next flush; after
// any other error they may have been applied, and are not sent again.
func (s *Store) sendDebt(e *debt) {
	d := s.debts
	timeout := s.timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	items := []store.Item{e.item}
	var one [1]*breaker
	if !allClosed(s.route(ctx, items, one[:0])) {
		d.putBack(e)
		return
	}
	epoch := s.cache.epoch.Load()
	out := make([]tiers.Decision, 1)
	d.flushes.Add(1)
	err := s.remote.Decide(ctx, e.at, items, out)
	switch {
	case err == nil:
		plan := s.cache.plan(items)
		s.cache.insert(epoch, e.at, plan, items, out)
		s.cache.putPlan(plan)
	case errors.Is(err, store.ErrNotSent) && !errors.Is(err, store.ErrStuck):
		d.flushErrors.Add(1)
		d.putBack(e)
	default:
		d.flushErrors.Add(1)
	}
}

// settleDebts sends the debits summed so far now, after the flush in
// flight if any.
func (s *Store) settleDebts() {
	if s.debts != nil {
		s.flushDebts()
	}
}

// closeDebts stops the timer and sends what is summed, before the remote
// closes.
func (s *Store) closeDebts() {
	if s.debts == nil {
		return
	}
	d := s.debts
	d.mu.Lock()
	d.closed = true
	if d.timer != nil && d.timer.Stop() {
		d.armed = false
	}
	d.mu.Unlock()
	s.flushDebts()
}
