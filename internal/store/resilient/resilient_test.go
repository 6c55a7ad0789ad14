package resilient_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/internal/store/resilient"
	"github.com/charonlimit/charon/internal/store/storetest"
	"github.com/charonlimit/charon/tiers"
)

var (
	simple = &tiers.Policy{Kind: tiers.KindTiers, Tiers: []tiers.Tier{{Limit: 3, Window: time.Second, Active: tiers.Unbounded}}}
	global = &tiers.Policy{Kind: tiers.KindTiers, GlobalLimit: 4, Tiers: []tiers.Tier{{Limit: 10, Window: time.Second, Active: tiers.Unbounded}}}
	closed = &tiers.Policy{Kind: tiers.KindTiers}
	t0     = storetest.T0
)

func take(p *tiers.Policy, domain string, hits int64) store.Item {
	return store.Item{Key: store.Key{Resource: "r", Domain: domain, PolicyID: 1}, Policy: p, Hits: hits, Min: hits}
}

func refund(p *tiers.Policy, domain string, hits int64) store.Item {
	it := take(p, domain, hits)
	it.Refund = true
	return it
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		return resilient.New(newFake(), resilient.Options{CacheSize: -1})
	})
}

func TestParseMode(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want resilient.Mode
	}{
		{"local", resilient.ModeLocal},
		{"open", resilient.ModeOpen},
		{"closed", resilient.ModeClosed},
		{" Unavailable ", resilient.ModeUnavailable},
	} {
		got, err := resilient.ParseMode(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseMode(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
		if got.String() != strings.ToLower(strings.TrimSpace(tt.in)) {
			t.Errorf("%v.String() = %q", got, got.String())
		}
	}
	for _, in := range []string{"", "deny", "local,open"} {
		_, err := resilient.ParseMode(in)
		if !errors.Is(err, resilient.ErrBadMode) || !strings.Contains(err.Error(), "--failure-mode") {
			t.Errorf("ParseMode(%q) error = %v, want ErrBadMode naming --failure-mode", in, err)
		}
	}
	var m resilient.Mode
	fs := flag.NewFlagSet("charon", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Var(&m, "failure-mode", "")
	if err := fs.Parse([]string{"--failure-mode", "closed"}); err != nil || m != resilient.ModeClosed {
		t.Errorf("flag: mode %v, err %v; want closed", m, err)
	}
	if err := fs.Parse([]string{"--failure-mode", "bogus"}); err == nil {
		t.Error("flag accepted bogus")
	}
}

// TestModesWithFailingRemote checks what each mode answers when every remote
// call fails, before and after the breaker opens.
func TestModesWithFailingRemote(t *testing.T) {
	items := []store.Item{take(simple, "a", 2), refund(simple, "b", 1)}
	t.Run("local", func(t *testing.T) {
		f := newFake()
		f.set(fail)
		s := resilient.New(f, resilient.Options{Now: newClock().Now})
		defer s.Close()
		ref := memstore.New(memstore.Options{})
		for i := range 4 {
			got := storetest.Decide(t, s, t0, items...)
			want := storetest.Decide(t, ref, t0, items...)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("call %d: local decisions differ from a memstore's (-want +got):\n%s", i, diff)
			}
		}
		st := s.Stats()
		if st.Local != 4 || st.Remote != 0 || st.RemoteErrors != 4 || !s.Serving() {
			t.Errorf("stats %+v, serving %v; want 4 local calls, 4 remote errors, serving", st, s.Serving())
		}
	})
	t.Run("open", func(t *testing.T) {
		f := newFake()
		f.set(fail)
		s := resilient.New(f, resilient.Options{Mode: resilient.ModeOpen, Now: newClock().Now})
		defer s.Close()
		for range 10 {
			got := storetest.Decide(t, s, t0, items...)
			if !got[0].OK || got[0].Granted != 2 || got[0].RetryAfter != 0 || !got[1].OK || got[1].Granted != 0 {
				t.Fatalf("open: %+v, want everything OK, item 0 granted 2, refund granted 0", got)
			}
			if got[0].Tier != 1 || got[0].TierLimit != 3 {
				t.Errorf("open: context %+v, want the first tier's", got[0])
			}
		}
		if st := s.Stats(); st.Open != 10 || st.RemoteErrors != 5 || st.Breaker != resilient.BreakerOpen || !s.Serving() {
			t.Errorf("stats %+v, serving %v; want 10 open calls, 5 remote errors (then the breaker), serving", st, s.Serving())
		}
	})
	t.Run("closed", func(t *testing.T) {
		f := newFake()
		f.set(fail)
		clk := newClock()
		s := resilient.New(f, resilient.Options{Mode: resilient.ModeClosed, Now: clk.Now, CoolOff: 2 * time.Second})
		defer s.Close()
		got := storetest.Decide(t, s, t0, items...)
		if got[0].OK || got[0].Granted != 0 || got[0].RetryAfter != 2*time.Second || got[0].ResetAfter != 2*time.Second || !got[1].OK {
			t.Fatalf("closed: %+v, want item 0 rejected with RetryAfter 2s, refund OK", got)
		}
		for range 4 {
			storetest.Decide(t, s, t0, items...)
		}
		clk.Advance(500 * time.Millisecond)
		got = storetest.Decide(t, s, t0, items...)
		if got[0].OK || got[0].RetryAfter != 1500*time.Millisecond {
			t.Fatalf("closed, breaker open for 1.5s more: %+v, want RetryAfter 1.5s", got[0])
		}
		if st := s.Stats(); st.Closed != 6 || !s.Serving() {
			t.Errorf("stats %+v, serving %v; want 6 closed calls, serving", st, s.Serving())
		}
	})
	t.Run("unavailable", func(t *testing.T) {
		f := newFake()
		f.set(fail)
		var changes []resilient.BreakerState
		s := resilient.New(f, resilient.Options{Mode: resilient.ModeUnavailable, Now: newClock().Now,
			OnBreakerChange: func(b resilient.BreakerState) { changes = append(changes, b) }})
		defer s.Close()
		out := make([]tiers.Decision, len(items))
		for i := range 6 {
			err := s.Decide(context.Background(), t0, items, out)
			if !errors.Is(err, resilient.ErrUnavailable) {
				t.Fatalf("call %d: err = %v, want ErrUnavailable", i, err)
			}
			if i < 5 && !errors.Is(err, errRemote) {
				t.Errorf("call %d: err = %v, want the remote's error wrapped", i, err)
			}
			if i == 5 && !errors.Is(err, resilient.ErrBreakerOpen) {
				t.Errorf("call %d: err = %v, want ErrBreakerOpen", i, err)
			}
			if serving := s.Serving(); serving != (i < 4) {
				t.Errorf("after call %d: Serving() = %v", i, serving)
			}
		}
		if diff := cmp.Diff([]resilient.BreakerState{resilient.BreakerOpen}, changes); diff != "" {
			t.Errorf("breaker changes (-want +got):\n%s", diff)
		}
		if st := s.Stats(); st.Unavailable != 6 || st.RemoteErrors != 5 || st.BreakerOpens != 1 {
			t.Errorf("stats %+v; want 6 unavailable, 5 remote errors, 1 opening", st)
		}
	})
}

// TestLocalModeReturnsToRemote: during an outage the local store decides;
// once a probe succeeds the remote decides again, with its own state.
func TestLocalModeReturnsToRemote(t *testing.T) {
	f := newFake()
	clk := newClock()
	s := resilient.New(f, resilient.Options{Now: clk.Now, FailureThreshold: 1})
	defer s.Close()
	storetest.Decide(t, s, t0, take(simple, "a", 3)) // remote: a exhausted
	f.set(fail)
	if d := storetest.Decide(t, s, t0, take(simple, "a", 1)); !d[0].OK {
		t.Fatalf("local store has no history of a, should grant: %+v", d[0])
	}
	f.set(answer)
	clk.Advance(resilient.DefaultCoolOff)
	if err := s.Probe(context.Background()); err != nil {
		t.Fatalf("Probe: %v", err)
	}
	if d := storetest.Decide(t, s, t0, take(simple, "a", 1)); d[0].OK {
		t.Fatalf("back on the remote, a is exhausted: %+v", d[0])
	}
	if st := s.Stats(); st.Remote != 2 || st.Local != 1 || st.Breaker != resilient.BreakerClosed {
		t.Errorf("stats %+v; want 2 remote, 1 local, breaker closed", st)
	}
}

// TestTimeoutBounded is the only test that reads the wall clock: a remote
// that hangs is given up after Timeout (20 ms), not waited for. The bound
// asserted is 100 times that, so a busy machine cannot fail it while a hang
// still does.
func TestTimeoutBounded(t *testing.T) {
	for _, mode := range []resilient.Mode{resilient.ModeLocal, resilient.ModeUnavailable} {
		f := newFake()
		f.set(hang)
		s := resilient.New(f, resilient.Options{Mode: mode, Timeout: 20 * time.Millisecond})
		out := make([]tiers.Decision, 1)
		start := time.Now()
		err := s.Decide(context.Background(), t0, []store.Item{take(simple, "a", 1)}, out)
		elapsed := time.Since(start)
		if elapsed >= 2*time.Second {
			t.Errorf("%v: a hanging remote took %v, want about the 20ms timeout", mode, elapsed)
		}
		switch mode {
		case resilient.ModeLocal:
			if err != nil || !out[0].OK {
				t.Errorf("local: %v, %+v; want a local grant", err, out[0])
			}
		case resilient.ModeUnavailable:
			if !errors.Is(err, resilient.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("unavailable: err = %v, want ErrUnavailable and DeadlineExceeded", err)
			}
		}
		if st := s.Stats(); st.Timeouts != 1 || st.RemoteErrors != 1 {
			t.Errorf("%v: stats %+v, want 1 timeout", mode, st)
		}
		s.Close()
	}
}

// TestBreakerOpensAndProbeCloses: failures open the breaker; decisions
// then never reach the remote, during the cool-off or after it; only Probe,
// once the cool-off is over and under ProbeTimeout rather than the
// decisions' short Timeout, pings it, and a good ping closes the breaker.
// A failed ping leaves it open with no new cool-off and no opening counted.
func TestBreakerOpensAndProbeCloses(t *testing.T) {
	f := newFake()
	f.set(fail)
	clk := newClock()
	var changes []resilient.BreakerState
	s := resilient.New(f, resilient.Options{Now: clk.Now, FailureThreshold: 3, FailureRate: -1, CoolOff: time.Second,
		ProbeTimeout: 300 * time.Millisecond, OnBreakerChange: func(b resilient.BreakerState) { changes = append(changes, b) }})
	defer s.Close()
	ctx := context.Background()
	call := func() { storetest.Decide(t, s, t0, take(simple, "a", 1)) }
	want := func(what string, calls, pings int64, state resilient.BreakerState) {
		t.Helper()
		if got := f.calls.Load(); got != calls {
			t.Errorf("%s: %d remote calls, want %d", what, got, calls)
		}
		if got := f.pings.Load(); got != pings {
			t.Errorf("%s: %d pings, want %d", what, got, pings)
		}
		if got := s.Stats().Breaker; got != state {
			t.Errorf("%s: breaker %v, want %v", what, got, state)
		}
	}
	call()
	call()
	want("two failures", 2, 0, resilient.BreakerClosed)
	call()
	want("three failures", 3, 0, resilient.BreakerOpen)
	for range 10 {
		call()
	}
	want("open", 3, 0, resilient.BreakerOpen)
	clk.Advance(time.Second - time.Nanosecond)
	if err := s.Probe(ctx); err != nil {
		t.Fatalf("Probe during the cool-off: %v", err)
	}
	want("Probe just before the cool-off ends", 3, 0, resilient.BreakerOpen)
	clk.Advance(time.Nanosecond)
	call()
	want("a decision after the cool-off", 3, 0, resilient.BreakerOpen)
	for i := range 2 {
		if err := s.Probe(ctx); !errors.Is(err, errRemote) {
			t.Fatalf("Probe %d with the remote down: %v, want its error", i, err)
		}
	}
	want("two failed pings", 3, 2, resilient.BreakerOpen)
	f.set(answer)
	if err := s.Probe(ctx); err != nil {
		t.Fatalf("Probe: %v", err)
	}
	if left := time.Duration(f.left.Load()); left <= resilient.DefaultTimeout || left > 300*time.Millisecond {
		t.Errorf("Probe's ping had %v to its deadline, want ProbeTimeout (300ms), not the decisions' Timeout", left)
	}
	want("good ping", 3, 3, resilient.BreakerClosed)
	call()
	want("closed", 4, 3, resilient.BreakerClosed)
	if diff := cmp.Diff([]resilient.BreakerState{resilient.BreakerOpen, resilient.BreakerClosed}, changes); diff != "" {
		t.Errorf("transitions (-want +got):\n%s", diff)
	}
	if st := s.Stats(); st.BreakerOpens != 1 || st.Remote != 1 || st.RemoteErrors != 5 || st.Local != 14 {
		t.Errorf("stats %+v; want 1 opening, 1 remote, 5 errors (3 calls, 2 pings), 14 local", st)
	}
}

func TestBreakerFailureRate(t *testing.T) {
	f := newFake()
	clk := newClock()
	s := resilient.New(f, resilient.Options{Now: clk.Now, FailureThreshold: 100, FailureRate: 0.5, RateMinCalls: 6, RateWindow: time.Second})
	defer s.Close()
	for i := range 5 {
		f.set([]int32{answer, fail}[i%2])
		storetest.Decide(t, s, t0, take(simple, "a", 1))
	}
	if st := s.Stats(); st.Breaker != resilient.BreakerClosed {
		t.Fatalf("5 calls, 2 failures: breaker %v, want closed (fewer than 6 calls)", st.Breaker)
	}
	f.set(fail)
	storetest.Decide(t, s, t0, take(simple, "a", 1))
	if st := s.Stats(); st.Breaker != resilient.BreakerOpen {
		t.Fatalf("6 calls, 3 failures: breaker %v, want open", st.Breaker)
	}
	// A new window forgets the old calls.
	clk.Advance(time.Second)
	f.set(answer)
	if err := s.Probe(context.Background()); err != nil || s.Stats().Breaker != resilient.BreakerClosed {
		t.Fatalf("Probe: %v, breaker %v; want closed", err, s.Stats().Breaker)
	}
	for i := range 5 {
		f.set([]int32{fail, answer}[i%2])
		storetest.Decide(t, s, t0, take(simple, "a", 1))
	}
	clk.Advance(time.Second)
	f.set(fail)
	storetest.Decide(t, s, t0, take(simple, "a", 1))
	if st := s.Stats(); st.Breaker != resilient.BreakerClosed {
		t.Fatalf("failures spread over two windows: breaker %v, want closed", st.Breaker)
	}
}

// TestProbesOverlap: a ping that hangs (a remote that swallows bytes)
// does not hold back the next Probe: once the remote answers again, the
// next ping closes the breaker while the first still hangs. At most
// MaxProbes pings are in flight at once; decisions never ping.
func TestProbesOverlap(t *testing.T) {
	opened := func(t *testing.T) (*resilient.Store, *fakeRemote) {
		f := newFake()
		f.set(fail)
		clk := newClock()
		s := resilient.New(f, resilient.Options{Now: clk.Now, FailureThreshold: 1, ProbeTimeout: time.Minute})
		t.Cleanup(func() { s.Close() })
		storetest.Decide(t, s, t0, take(simple, "a", 1))
		clk.Advance(time.Second)
		return s, f
	}
	t.Run("back while a ping hangs", func(t *testing.T) {
		s, f := opened(t)
		f.set(gate)
		done := make(chan error)
		go func() { done <- s.Probe(context.Background()) }()
		<-f.entered // the first ping hangs
		f.set(answer)
		if err := s.Probe(context.Background()); err != nil || f.pings.Load() != 2 {
			t.Errorf("Probe while a ping hangs: %v after %d pings, want nil after 2", err, f.pings.Load())
		}
		if st := s.Stats(); st.Breaker != resilient.BreakerClosed {
			t.Errorf("breaker %v after the second ping answered, want closed", st.Breaker)
		}
		storetest.Decide(t, s, t0, take(simple, "a", 1))
		if got := f.calls.Load(); got != 2 {
			t.Errorf("%d remote calls, want 2 (the failure, then Redis again)", got)
		}
		close(f.release)
		if err := <-done; err != nil {
			t.Fatalf("the hung ping: %v", err)
		}
	})
	t.Run("at most MaxProbes", func(t *testing.T) {
		s, f := opened(t)
		f.set(gate)
		done := make(chan error, resilient.MaxProbes)
		for range resilient.MaxProbes {
			go func() { done <- s.Probe(context.Background()) }()
			<-f.entered
		}
		if err := s.Probe(context.Background()); err != nil || f.pings.Load() != resilient.MaxProbes {
			t.Errorf("Probe with %d pings hanging: %v after %d pings, want nil and no ping", resilient.MaxProbes, err, f.pings.Load())
		}
		storetest.Decide(t, s, t0, take(simple, "a", 1))
		if got := f.calls.Load(); got != 1 {
			t.Errorf("%d remote calls, want 1 (the failure): decisions never ping", got)
		}
		close(f.release)
		for range resilient.MaxProbes {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		if st := s.Stats(); st.Breaker != resilient.BreakerClosed || st.Local != 2 {
			t.Errorf("after the pings: %+v, want closed, 2 local", st)
		}
	})
}

// TestCanceledProbe: a ping whose caller goes away proves nothing and counts
// no error; the next Probe pings again.
func TestCanceledProbe(t *testing.T) {
	f := newFake()
	f.set(fail)
	clk := newClock()
	s := resilient.New(f, resilient.Options{Now: clk.Now, FailureThreshold: 1, Mode: resilient.ModeUnavailable})
	defer s.Close()
	out := make([]tiers.Decision, 1)
	s.Decide(context.Background(), t0, []store.Item{take(simple, "a", 1)}, out)
	clk.Advance(time.Second)
	f.set(hang)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Probe(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled Probe: err = %v, want context.Canceled", err)
	}
	if st := s.Stats(); st.Breaker != resilient.BreakerOpen || st.RemoteErrors != 1 {
		t.Fatalf("after a canceled ping: %+v, want open, 1 remote error", st)
	}
	f.set(answer)
	if err := s.Probe(context.Background()); err != nil || s.Stats().Breaker != resilient.BreakerClosed {
		t.Fatalf("after the next Probe: %v, %+v; want closed", err, s.Stats())
	}
}

func TestCloseAndBadItems(t *testing.T) {
	f := newFake()
	s := resilient.New(f, resilient.Options{})
	out := make([]tiers.Decision, 1)
	bad := take(simple, "a", 1)
	bad.Min = 2
	if err := s.Decide(context.Background(), t0, []store.Item{bad}, out); !errors.Is(err, store.ErrBadItem) {
		t.Errorf("bad item: err = %v, want store.ErrBadItem", err)
	}
	if err := s.Decide(context.Background(), t0, []store.Item{take(simple, "a", 1)}, nil); !errors.Is(err, store.ErrBadItem) {
		t.Errorf("short out: err = %v, want store.ErrBadItem", err)
	}
	if f.calls.Load() != 0 {
		t.Errorf("bad calls reached the remote")
	}
	if err := s.Close(); err != nil || s.Close() != nil {
		t.Fatalf("Close: %v", err)
	}
	if !f.closed.Load() || s.Serving() {
		t.Errorf("after Close: remote closed %v, Serving %v; want true, false", f.closed.Load(), s.Serving())
	}
	if err := s.Decide(context.Background(), t0, []store.Item{take(simple, "a", 1)}, out); !errors.Is(err, store.ErrClosed) {
		t.Errorf("after Close: err = %v, want store.ErrClosed", err)
	}
}

func TestNilRemote(t *testing.T) {
	s := resilient.New(nil, resilient.Options{Mode: resilient.ModeUnavailable})
	defer s.Close()
	out := make([]tiers.Decision, 1)
	if err := s.Decide(context.Background(), t0, []store.Item{take(simple, "a", 1)}, out); !errors.Is(err, resilient.ErrNoRemote) {
		t.Errorf("err = %v, want ErrNoRemote", err)
	}
}

// TestProbeWithoutTraffic: an idle wrapper in unavailable mode, whose
// readiness stops the traffic while it is not Serving, recovers through
// Probe.
func TestProbeWithoutTraffic(t *testing.T) {
	f := newFake()
	f.set(fail)
	clk := newClock()
	s := resilient.New(f, resilient.Options{Mode: resilient.ModeUnavailable, Now: clk.Now, FailureThreshold: 1})
	defer s.Close()
	if err := s.Probe(context.Background()); err != nil || f.pings.Load() != 0 {
		t.Fatalf("closed breaker: Probe = %v after %d pings, want nil and none", err, f.pings.Load())
	}
	out := make([]tiers.Decision, 1)
	s.Decide(context.Background(), t0, []store.Item{take(simple, "a", 1)}, out)
	if s.Serving() {
		t.Fatal("serving with the breaker open in unavailable mode")
	}
	s.Probe(context.Background())
	if f.pings.Load() != 0 {
		t.Fatal("pinged during the cool-off")
	}
	clk.Advance(time.Second)
	if err := s.Probe(context.Background()); !errors.Is(err, errRemote) || s.Serving() || s.Stats().BreakerOpens != 1 {
		t.Fatalf("failed ping: %v, serving %v, stats %+v; want the error, not serving, 1 opening", err, s.Serving(), s.Stats())
	}
	f.set(answer)
	if err := s.Probe(context.Background()); err != nil || !s.Serving() || f.pings.Load() != 2 {
		t.Fatalf("good ping: %v, serving %v, %d pings; want nil, serving, 2", err, s.Serving(), f.pings.Load())
	}
}

func TestNilRemoteProbe(t *testing.T) {
	clk := newClock()
	s := resilient.New(nil, resilient.Options{Mode: resilient.ModeUnavailable, Now: clk.Now, FailureThreshold: 1})
	defer s.Close()
	out := make([]tiers.Decision, 1)
	s.Decide(context.Background(), t0, []store.Item{take(simple, "a", 1)}, out)
	clk.Advance(time.Second)
	if err := s.Probe(context.Background()); !errors.Is(err, resilient.ErrNoRemote) || s.Serving() {
		t.Errorf("Probe = %v, serving %v; want ErrNoRemote, not serving", err, s.Serving())
	}
}

// Calls in flight when the breaker opens fail too; they are not evidence
// for the next opening: after a probe closes the breaker it takes
// FailureThreshold new failures to open it again.
func TestInFlightFailuresDoNotCarryOver(t *testing.T) {
	f := newFake()
	f.set(gateFail)
	clk := newClock()
	s := resilient.New(f, resilient.Options{Now: clk.Now, FailureThreshold: 3, FailureRate: -1, CoolOff: time.Second, CacheSize: -1})
	defer s.Close()
	const inFlight = 7
	var wg sync.WaitGroup
	for i := range inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]tiers.Decision, 1)
			_ = s.Decide(context.Background(), t0, []store.Item{take(simple, fmt.Sprint("k", i), 1)}, out)
		}()
	}
	for range inFlight {
		<-f.entered
	}
	close(f.release)
	wg.Wait()
	if st := s.Stats(); st.Breaker != resilient.BreakerOpen || st.BreakerOpens != 1 {
		t.Fatalf("after %d failed calls: breaker %v, %d openings; want open, 1", inFlight, st.Breaker, st.BreakerOpens)
	}
	f.set(answer)
	clk.Advance(time.Second)
	if err := s.Probe(context.Background()); err != nil || s.Stats().Breaker != resilient.BreakerClosed {
		t.Fatalf("probe: %v, breaker %v; want it closed", err, s.Stats().Breaker)
	}
	f.set(fail)
	for i := 1; i <= 3; i++ {
		storetest.Decide(t, s, t0, take(simple, "a", 1))
		want := resilient.BreakerClosed
		if i == 3 {
			want = resilient.BreakerOpen
		}
		if got := s.Stats().Breaker; got != want {
			t.Errorf("failure %d after the probe: breaker %v, want %v", i, got, want)
		}
	}
}

// replied is a remote that answers every call with an error about its
// data: Redis up, the call's state at fault.
type replied struct{ *fakeRemote }

func (replied) Decide(context.Context, time.Time, []store.Item, []tiers.Decision) error {
	return fmt.Errorf("remote: %w: WRONGTYPE Operation against a key holding the wrong kind of value", store.ErrReplied)
}

// TestRepliedErrorsKeepTheBreakerClosed: errors the remote answers about a
// call's data (one corrupted hot key) go to the failure mode for that call
// and never open the breaker for everyone.
func TestRepliedErrorsKeepTheBreakerClosed(t *testing.T) {
	s := resilient.New(replied{newFake()}, resilient.Options{FailureThreshold: 1, FailureRate: -1, CacheSize: -1})
	defer s.Close()
	for range 3 { // simple's limit
		if d := storetest.Decide(t, s, t0, take(simple, "hot", 1))[0]; !d.OK {
			t.Fatalf("a replied error in ModeLocal: %+v, want the local grant", d)
		}
	}
	if st := s.Stats(); st.Breaker != resilient.BreakerClosed || st.BreakerOpens != 0 || st.Local != 3 || st.RemoteErrors != 3 {
		t.Errorf("after 3 replied errors: %+v; want the breaker closed, 3 local answers, 3 remote errors", st)
	}
}
