package main

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/charonlimit/charon/internal/engine"
)

// concConfig limits each tenant to concLimit requests in flight, each slot
// living concTTL unless a refund gives it back first.
const (
	concLimit  = 4
	concKilled = 2
	concTTL    = 3 * time.Second
	concConfig = `domain: llm
descriptors:
  - key: tenant
    concurrency: {limit: 4, ttl: 3s}
`
)

// envoyStream is one request as Envoy's rate limit filter with the
// concurrency recipe of docs/configuration.md makes it: a take at the
// request, and at stream end a refund of the slots the answer's dynamic
// metadata names (charon.slots as hits_addend, charon.slot as the last
// entry), sent only when the answer names some.
type envoyStream struct {
	procs  []*proc // each call goes to one of them, at random
	r      *rand.Rand
	slots  float64
	slot   string
	tenant string
}

func (s *envoyStream) rls() rlsv3.RateLimitServiceClient {
	return s.procs[s.r.IntN(len(s.procs))].rls
}

func (s *envoyStream) take(ctx context.Context) (bool, error) {
	resp, err := s.rls().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: s.tenant}},
	}}})
	if err != nil {
		return false, err
	}
	c := resp.GetDynamicMetadata().GetFields()["charon"].GetStructValue().GetFields()
	s.slots, s.slot = c["slots"].GetNumberValue(), c["slot"].GetStringValue()
	return resp.OverallCode == rlsv3.RateLimitResponse_OK, nil
}

// done is the stream-done refund; a stream whose answer named no slots
// sends none (Envoy's metadata action finds nothing and drops it).
func (s *envoyStream) done(ctx context.Context) error {
	if s.slot == "" || s.slots <= 0 {
		return nil
	}
	_, err := s.rls().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
			{Key: "tenant", Value: s.tenant},
			{Key: engine.SlotKey, Value: s.slot},
		},
		HitsAddend:     wrapperspb.UInt64(uint64(s.slots)),
		IsNegativeHits: true,
	}}})
	return err
}

// usedSlots reads the slots held by tenant from GET /usage.
func usedSlots(t *testing.T, p *proc, tenant string) int64 {
	t.Helper()
	body := get(t, "http://"+p.httpAddr+"/usage?domain=llm&descriptor="+url.QueryEscape("tenant="+tenant))
	var u struct {
		Limits []struct {
			Kind string `json:"kind"`
			Used int64  `json:"used"`
		} `json:"limits"`
	}
	if err := json.Unmarshal([]byte(body), &u); err != nil || len(u.Limits) != 1 || u.Limits[0].Kind != "concurrency" {
		t.Fatalf("GET /usage: %v: %s", err, body)
	}
	return u.Limits[0].Used
}

// TestConcurrencyKilledClientsEveryStore: concKilled clients take slots and
// are killed (they never send their stream-done refund), while more
// clients than the limit keep taking slots, holding them a few
// milliseconds and giving them back as Envoy does. On the memory store, a
// single Redis and a Redis Cluster (two processes sharing it, each call
// going to either: a refund often reaches another process than its take):
//   - the live requests in flight never number more than the limit less
//     the killed clients' slots until those slots' ttl has passed (the
//     others' refunds give back their own slots, not the killed ones'), and
//     never more than the limit at all;
//   - once the ttl has passed the live clients get the whole limit again,
//     although traffic never paused;
//   - GET /usage shows the killed clients' slots held, and none once every
//     live client has ended and the ttl has passed.
//
// In flight is counted by the clients, from a grant's answer to the sending
// of its refund: inside the span the server counts, so a count above a
// bound here is one above it there.
func TestConcurrencyKilledClientsEveryStore(t *testing.T) {
	bin := buildCharon(t)
	dir := writeConfigDir(t, "llm.yaml", concConfig)
	for _, st := range everyStore() {
		t.Run(st.name, func(t *testing.T) {
			args := st.serveArgs(t, dir)
			p := startServe(t, bin, args...)
			procs := []*proc{p}
			if st.name != "memory" {
				procs = append(procs, startServe(t, bin, args...))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			tenant := "acme-" + st.name

			// The killed clients: their takes are granted, their refunds
			// never come.
			start := time.Now()
			for i := range concKilled {
				s := &envoyStream{procs: procs, r: rand.New(rand.NewPCG(uint64(i), 5)), tenant: tenant}
				ok, err := s.take(ctx)
				if err != nil || !ok || s.slot == "" {
					t.Fatalf("killed client %d: granted %v, slot %q, %v\n%s", i, ok, s.slot, err, p.stderr.String())
				}
			}
			if got := usedSlots(t, p, tenant); got != concKilled {
				t.Fatalf("/usage after the killed clients' takes: %d slots held, want %d", got, concKilled)
			}
			// Until held is the instant before which the killed slots are
			// surely held: they were stamped after start.
			held := start.Add(concTTL - 100*time.Millisecond)

			var (
				inflight, maxBefore, maxAll atomic.Int64
				rejected                    atomic.Int64
				full                        = make(chan time.Time, 1)
				stop                        = make(chan struct{})
				wg                          sync.WaitGroup
				errs                        = make(chan error, 16)
			)
			for w := range concLimit + 1 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(w), 3))
					for {
						select {
						case <-stop:
							return
						default:
						}
						s := &envoyStream{procs: procs, r: r, tenant: tenant}
						ok, err := s.take(ctx)
						if err != nil {
							errs <- err
							return
						}
						if !ok {
							rejected.Add(1)
							if err := s.done(ctx); err != nil { // sends nothing: no slot named
								errs <- err
								return
							}
							time.Sleep(time.Duration(2+r.IntN(10)) * time.Millisecond)
							continue
						}
						n := inflight.Add(1)
						at := time.Now()
						for m := maxAll.Load(); n > m && !maxAll.CompareAndSwap(m, n); m = maxAll.Load() {
						}
						if at.Before(held) {
							for m := maxBefore.Load(); n > m && !maxBefore.CompareAndSwap(m, n); m = maxBefore.Load() {
							}
						}
						if n == concLimit {
							select {
							case full <- at:
							default:
							}
						}
						time.Sleep(time.Duration(5+r.IntN(30)) * time.Millisecond)
						inflight.Add(-1)
						if err := s.done(ctx); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			var fullAt time.Time
			select {
			case fullAt = <-full:
			case err := <-errs:
				t.Fatalf("a client failed: %v\n%s", err, p.stderr.String())
			case <-time.After(concTTL + 30*time.Second):
				t.Fatalf("the live clients never held all %d slots again within the ttl (%v) and 30 s of slack; %d slots held at most", concLimit, concTTL, maxAll.Load())
			}
			close(stop)
			wg.Wait()
			select {
			case err := <-errs:
				t.Fatalf("a client failed: %v\n%s", err, p.stderr.String())
			default:
			}
			t.Logf("the whole limit again %v after the killed clients' takes; %d rejections", fullAt.Sub(start).Round(time.Millisecond), rejected.Load())
			if m := maxBefore.Load(); m > concLimit-concKilled {
				t.Errorf("%d live requests in flight while the killed clients' %d slots were held: over the limit of %d", m, concKilled, concLimit)
			}
			if m := maxAll.Load(); m > concLimit {
				t.Errorf("%d live requests in flight: over the limit of %d", m, concLimit)
			}
			if fullAt.Before(held) {
				t.Errorf("all %d slots taken by live clients %v after the killed clients' takes, before their ttl of %v", concLimit, fullAt.Sub(start), concTTL)
			}
			if rejected.Load() == 0 {
				t.Error("no request was rejected: the limit was never reached")
			}
			// Every live client ended with a refund: once the last slots
			// taken have lived their ttl at the latest, none is held.
			eventually(t, "no slot held once every client ended", func() bool { return usedSlots(t, p, tenant) == 0 })

			if len(procs) == 2 {
				// A slot given back through one process is free at once on
				// the other, which had just refused the tenant: no process
				// keeps a concurrency limit's refusal for later.
				tenant := "solo-" + st.name
				a := &envoyStream{procs: procs[:1], r: rand.New(rand.NewPCG(1, 1)), tenant: tenant}
				for i := range concLimit {
					if ok, err := a.take(ctx); err != nil || !ok {
						t.Fatalf("take %d through the first process: %v %v", i, ok, err)
					}
				}
				if ok, err := (&envoyStream{procs: procs[:1], r: a.r, tenant: tenant}).take(ctx); err != nil || ok {
					t.Fatalf("a take over the limit through the first process: granted %v, %v", ok, err)
				}
				b := &envoyStream{procs: procs[1:], r: a.r, tenant: tenant, slots: a.slots, slot: a.slot}
				if err := b.done(ctx); err != nil {
					t.Fatal(err)
				}
				if ok, err := (&envoyStream{procs: procs[:1], r: a.r, tenant: tenant}).take(ctx); err != nil || !ok {
					t.Errorf("the first process refused a slot the second had just been given back: granted %v, %v", ok, err)
				}
			}
			for _, p := range procs {
				p.stop(t)
			}
		})
	}
}
