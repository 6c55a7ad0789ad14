package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The token budget of docs/token-budgets.md: 10,000 tokens per tenant,
// post-paid, on a sliding hour, a fixed month and a calendar month.
const (
	tokenBudget   = 10_000
	settleClients = 64
	settleConfig  = `domain: ai
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 10000}
    overdraft: true
  - key: tenant_month
    rate_limit: {unit: month, requests_per_unit: 10000, algorithm: fixed_window}
    overdraft: true
  - key: tenant_quota
    quota: {limit: 10000, period: month}
    overdraft: true
`
)

// settleRun is what the clients of one run saw.
type settleRun struct {
	granted, refused int64
	used             int64 // tokens the granted requests used
	maxErr           int64 // the largest |actual - estimate| of a granted request
	maxUnder         int64 // the largest actual - estimate (0: never underestimated)
	maxInFlight      int64 // the most requests seen between their grant and their settle
}

// settler drives reserve-then-settle over RLS: reserve the estimate (its
// hits), use an actual amount when granted, then settle the difference.
type settler struct {
	t      *testing.T
	p      *proc
	key    string // the descriptor key: tenant, tenant_month or tenant_quota
	tenant string
	// envoy settles as Envoy's stream-done actions do: one request giving
	// back the estimate (is_negative_hits) and debiting the actual; else
	// as a client computing the difference: a refund of estimate-actual,
	// or a post-paid debit of actual-estimate.
	envoy bool
}

func (s *settler) descriptor(hits uint64, negative bool) *ratelimitv3.RateLimitDescriptor {
	return &ratelimitv3.RateLimitDescriptor{
		Entries:        []*ratelimitv3.RateLimitDescriptor_Entry{{Key: s.key, Value: s.tenant}},
		HitsAddend:     wrapperspb.UInt64(hits),
		IsNegativeHits: negative,
	}
}

func (s *settler) send(ds ...*ratelimitv3.RateLimitDescriptor) rlsv3.RateLimitResponse_Code {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := s.p.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "ai", Descriptors: ds})
	if err != nil {
		s.t.Errorf("ShouldRateLimit: %v\n%s", err, s.p.stderr.String())
		return rlsv3.RateLimitResponse_UNKNOWN
	}
	return resp.OverallCode
}

// reserve debits the estimate; a refused reservation is debited too (the
// budget is post-paid) and given back at once, as Envoy's stream-done
// refund does for a request it answered 429.
func (s *settler) reserve(estimate int64) bool {
	if s.send(s.descriptor(uint64(estimate), false)) == rlsv3.RateLimitResponse_OK {
		return true
	}
	s.send(s.descriptor(uint64(estimate), true))
	return false
}

// settle brings the count from the estimate to the actual.
func (s *settler) settle(estimate, actual int64) {
	switch {
	case s.envoy:
		s.send(s.descriptor(uint64(estimate), true), s.descriptor(uint64(actual), false))
	case actual < estimate:
		s.send(s.descriptor(uint64(estimate-actual), true))
	case actual > estimate:
		s.send(s.descriptor(uint64(actual-estimate), false))
	}
}

// count reads the budget's count from GET /usage once nothing is pending
// (the Redis store sends the refused reservations' debits every 20 ms):
// it polls until the count equals want, or returns what it last read.
func (s *settler) count(want int64) int64 {
	s.t.Helper()
	q := url.Values{"domain": {"ai"}, "descriptor": {s.key + "=" + s.tenant}}
	var got int64 = -1
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		var u struct {
			Limits []struct {
				Used int64 `json:"used"`
			} `json:"limits"`
		}
		body := get(s.t, "http://"+s.p.httpAddr+"/usage?"+q.Encode())
		if err := json.Unmarshal([]byte(body), &u); err != nil || len(u.Limits) != 1 {
			s.t.Fatalf("GET /usage: %v: %s", err, body)
		}
		if got = u.Limits[0].Used; got == want {
			break
		}
	}
	return got
}

// run lets settleClients clients reserve, use and settle until each has
// been refused three times in a row; actual gives a granted request's use
// from its estimate.
func (s *settler) run(seed uint64, estimate func(*rand.Rand) int64, actual func(r *rand.Rand, e int64) int64) settleRun {
	var (
		run      settleRun
		inFlight atomic.Int64
		mu       sync.Mutex
		wg       sync.WaitGroup
	)
	for c := range settleClients {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(c)))
			var mine settleRun
			for refusals := 0; refusals < 3; {
				e := estimate(r)
				if !s.reserve(e) {
					refusals++
					mine.refused++
					continue
				}
				refusals = 0
				n := inFlight.Add(1)
				mine.maxInFlight = max(mine.maxInFlight, n)
				u := actual(r, e)
				mine.granted++
				mine.used += u
				mine.maxErr = max(mine.maxErr, u-e, e-u)
				mine.maxUnder = max(mine.maxUnder, u-e)
				s.settle(e, u)
				inFlight.Add(-1)
			}
			mu.Lock()
			run.granted += mine.granted
			run.refused += mine.refused
			run.used += mine.used
			run.maxErr = max(run.maxErr, mine.maxErr)
			run.maxUnder = max(run.maxUnder, mine.maxUnder)
			run.maxInFlight = max(run.maxInFlight, mine.maxInFlight)
			mu.Unlock()
		})
	}
	wg.Wait()
	return run
}

// TestTokenBudgetSettleEveryStore measures reserve-then-settle on a
// post-paid budget of 10,000 tokens with 64 concurrent clients over RLS,
// on the memory store, a single Redis and a Redis Cluster, on a sliding
// hour, a fixed month and a calendar month's quota (docs/token-budgets.md):
//
//   - estimates never below the use (refunds only): the tokens used never
//     exceed the budget;
//   - estimates off by up to ±50 both ways: the overspend is at most the
//     underestimates of the requests in flight at the last grant, so at
//     most 64 × 50; settled by a client's difference or by Envoy's
//     stream-done pair (give back the estimate, debit the actual);
//   - the worst case: 64 requests reserve 156 each (9,984 of 10,000), all
//     in flight, each then uses 206: 13,184 used, an overspend of 3,184,
//     64 times the error less the 16 left unreserved, not one error;
//
// and in every run the settled count equals the tokens actually used.
func TestTokenBudgetSettleEveryStore(t *testing.T) {
	bin := buildCharon(t)
	dir := writeConfigDir(t, "ai.yaml", settleConfig)
	for _, st := range everyStore() {
		t.Run(st.name, func(t *testing.T) {
			p := startServe(t, bin, st.serveArgs(t, dir)...)
			for _, key := range []string{"tenant", "tenant_month", "tenant_quota"} {
				t.Run(key, func(t *testing.T) { settleScenarios(t, p, st.name, key) })
			}
			p.stop(t)
		})
	}
}

func settleScenarios(t *testing.T, p *proc, store, key string) {
	estimate := func(r *rand.Rand) int64 { return 100 + r.Int64N(101) } // 100..200
	const d = 50                                                        // the largest error of the two-sided runs
	checkCount := func(s *settler, run settleRun) {
		t.Helper()
		if got := s.count(run.used); got != run.used {
			t.Errorf("%s: settled count %d, want the %d tokens the granted requests used", s.tenant, got, run.used)
		}
	}

	t.Run("estimates never below use", func(t *testing.T) {
		s := &settler{t: t, p: p, key: key, tenant: "over-" + store}
		run := s.run(1, estimate, func(r *rand.Rand, e int64) int64 { return e/2 + r.Int64N(e-e/2) }) // e/2..e-1
		if run.used > tokenBudget {
			t.Errorf("used %d of a budget of %d with estimates never below use, want at most the budget", run.used, tokenBudget)
		}
		checkCount(s, run)
		t.Logf("budget: %s %s, refunds only: %d granted, %d refused, used %d of %d (overspend %d), largest error %d, %d in flight at most",
			store, key, run.granted, run.refused, run.used, tokenBudget, run.used-tokenBudget, run.maxErr, run.maxInFlight)
	})
	for _, envoy := range []bool{false, true} {
		name := "errors both ways, settled by the difference"
		if envoy {
			name = "errors both ways, settled as Envoy's stream-done pair"
		}
		t.Run(name, func(t *testing.T) {
			s := &settler{t: t, p: p, key: key, tenant: fmt.Sprintf("both-%s-%v", store, envoy), envoy: envoy}
			run := s.run(2, estimate, func(r *rand.Rand, e int64) int64 {
				for {
					if u := e - d + r.Int64N(2*d+1); u != e {
						return u
					}
				}
			})
			if bound := int64(tokenBudget + settleClients*d); run.used > bound {
				t.Errorf("used %d, over the bound budget + 64 × %d = %d", run.used, d, bound)
			}
			checkCount(s, run)
			t.Logf("budget: %s %s, errors ±%d (envoy %v): %d granted, %d refused, used %d of %d (overspend %d; one request's largest underestimate %d, bound 64 × %d = %d), %d in flight at most",
				store, key, d, envoy, run.granted, run.refused, run.used, tokenBudget, run.used-tokenBudget, run.maxUnder, d, settleClients*d, run.maxInFlight)
		})
	}
	t.Run("worst case: every request in flight underestimated", func(t *testing.T) {
		s := &settler{t: t, p: p, key: key, tenant: "worst-" + store}
		const e, u = 156, 156 + d // 64 × 156 = 9,984 fits the budget
		var reserved, granted sync.WaitGroup
		var ok atomic.Int64
		reserved.Add(settleClients)
		for range settleClients {
			granted.Go(func() {
				g := s.reserve(e)
				if g {
					ok.Add(1)
				}
				reserved.Done()
				reserved.Wait() // every reservation made before any request settles
				if g {
					s.settle(e, u)
				}
			})
		}
		granted.Wait()
		used := ok.Load() * u
		if ok.Load() != settleClients {
			t.Fatalf("%d of 64 reservations of %d granted, want all (64 × %d = %d fits %d)", ok.Load(), e, e, settleClients*e, tokenBudget)
		}
		if want := int64(settleClients*d - (tokenBudget - settleClients*e)); used-tokenBudget != want {
			t.Errorf("overspend %d, want 64 × %d - %d = %d", used-tokenBudget, d, tokenBudget-settleClients*e, want)
		}
		if used-tokenBudget <= d {
			t.Errorf("overspend %d within one request's error %d: the worst case was not reached", used-tokenBudget, d)
		}
		checkCount(s, settleRun{used: used})
		if s.reserve(1) {
			t.Errorf("a reservation granted with the budget %d in debt", used-tokenBudget)
		}
		checkCount(s, settleRun{used: used})
		t.Logf("budget: %s %s, worst case: 64 in flight reserved %d each, used %d each: used %d of %d (overspend %d = 64 × %d - %d)",
			store, key, e, u, used, tokenBudget, used-tokenBudget, d, tokenBudget-settleClients*e)
	})
}
