package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/client"
)

// mustReserve reserves between min and copies copies of copyRes without
// waiting; an error ends the test.
func mustReserve(t *testing.T, c *client.Client, copies, min int64) *client.Hold {
	t.Helper()
	h, err := c.Reserve(context.Background(), copyRes, copies, min, 0)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// waitFor fails the test if ch is not closed soon; a guard, not a sleep.
func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// nextEvent returns the fake's next event; the test fails if none comes
// soon.
func nextEvent(t *testing.T, f *fake, what string) string {
	t.Helper()
	select {
	case ev := <-f.events:
		return ev
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		return ""
	}
}

func TestReserveReleaseClose(t *testing.T) {
	f, c, _ := fakeClient(t, 0, 10, client.Options{})
	ctx := context.Background()

	h := mustReserve(t, c, 6, 2)
	if !h.OK() || h.Copies() != 6 || h.ID() == "" || h.Degraded() || h.Forced() {
		t.Fatalf("got ok %v copies %d id %q; want a server hold of 6", h.OK(), h.Copies(), h.ID())
	}
	if got := h.Target(); got.Resource != copyKey {
		t.Errorf("target %+v, want resource %s", got, copyKey)
	}
	if h.Reply().GetContext().GetDomainLimit() != 10 || h.FencingToken() == 0 || len(h.Groups()) == 0 {
		t.Errorf("context %v, fencing %d, groups %v: want the server's context", h.Reply().GetContext(), h.FencingToken(), h.Groups())
	}

	// The pool has 4 left: at least 5 is rejected, up to 8 with min 1 gets 4.
	r, err := c.Reserve(ctx, copyRes, 8, 5, 0)
	if err != nil || r.OK() || r.Copies() != 0 || r.Reply().GetContext().GetTotalHolds() != 6 {
		t.Errorf("over the limit: got ok %v copies %d, %v; want a rejection with context", r.OK(), r.Copies(), err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("close of a rejection: %v", err)
	}
	h2, err := c.Reserve(ctx, copyRes, 8, 1, 0)
	if err != nil || h2.Copies() != 4 {
		t.Fatalf("got %d copies, %v; want the 4 left", h2.Copies(), err)
	}
	defer h2.Close()

	if err := h.Release(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if h.Copies() != 4 || f.heldOf(copyKey) != 8 {
		t.Errorf("after release 2: hold %d, server %d; want 4, 8", h.Copies(), f.heldOf(copyKey))
	}
	if err := h.Release(ctx, 5); !errors.Is(err, client.ErrOverRelease) {
		t.Errorf("release 5 of 4: got %v, want ErrOverRelease", err)
	}
	if err := h.Release(ctx, 0); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("release 0: got %v, want ErrInvalid", err)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if h.Copies() != 0 || f.heldOf(copyKey) != 4 {
		t.Errorf("after close: hold %d, server %d; want 0, 4", h.Copies(), f.heldOf(copyKey))
	}
	if err := h.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	if err := h.Release(ctx, 1); !errors.Is(err, client.ErrHoldClosed) {
		t.Errorf("release after close: got %v, want ErrHoldClosed", err)
	}
}

func TestReleaseAllThenClose(t *testing.T) {
	f, c, _ := fakeClient(t, 0, 3, client.Options{})
	ctx := context.Background()
	h := mustReserve(t, c, 3, 3)
	for i := 0; i < 3; i++ {
		if err := h.Release(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.Close(); err != nil {
		t.Errorf("close of an empty hold: %v", err)
	}
	if ids := f.holdIDs(); len(ids) != 0 || f.heldOf(copyKey) != 0 {
		t.Errorf("server holds %v, held %d; want none", ids, f.heldOf(copyKey))
	}
}

// TestCloseAfterTransferredAway: a hold whose copies were all transferred
// by another client, with its id, is gone on the server: Close has
// nothing to release and returns nil, not the release's NotFound.
func TestCloseAfterTransferredAway(t *testing.T) {
	f := newFake()
	f.copyLimit[copyKey] = 5
	conn, _ := serve(t, f)
	c := client.New(conn, client.Options{})
	defer c.Close()
	ctx := context.Background()
	h, err := c.Reserve(ctx, copyRes, 3, 3, 0)
	if err != nil || !h.OK() {
		t.Fatalf("reserve: %v", err)
	}
	if _, err := charonv1.NewCharonClient(conn).Transfer(ctx, &charonv1.TransferRequest{HoldId: h.ID()}); err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Errorf("Close of a hold transferred away: %v, want nil", err)
	}
}

// TestHoldGone: a hold whose copies another client transferred away, or
// released, with its id is gone on the server while the session lives.
// The hold learns it from Check or from any operation's NotFound: Gone is
// closed, Copies is 0, operations fail with ErrHoldGone (which keeps the
// server's NotFound), and Close has nothing to release. A hold that is
// there passes Check unchanged.
func TestHoldGone(t *testing.T) {
	for _, tc := range []struct {
		name  string
		other func(ctx context.Context, c charonv1.CharonClient, id string) error
		learn func(ctx context.Context, h *client.Hold) error
	}{
		{"transferred away, Check", transferAll, func(ctx context.Context, h *client.Hold) error { return h.Check(ctx) }},
		{"transferred away, Release", transferAll, func(ctx context.Context, h *client.Hold) error { return h.Release(ctx, 1) }},
		{"transferred away, Transfer", transferAll, func(ctx context.Context, h *client.Hold) error { _, err := h.Transfer(ctx, 1, 0); return err }},
		{"released by another, ReleaseAll", releaseAll, func(ctx context.Context, h *client.Hold) error { _, err := h.ReleaseAll(ctx); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake()
			f.copyLimit[copyKey] = 5
			conn, _ := serve(t, f)
			c := client.New(conn, client.Options{})
			defer c.Close()
			ctx := context.Background()
			h, err := c.Reserve(ctx, copyRes, 3, 3, 0)
			if err != nil || !h.OK() {
				t.Fatalf("reserve: %v", err)
			}
			if err := h.Check(ctx); err != nil || h.Copies() != 3 {
				t.Fatalf("Check of a hold that is there: %v, %d copies; want nil, 3", err, h.Copies())
			}
			if err := tc.other(ctx, charonv1.NewCharonClient(conn), h.ID()); err != nil {
				t.Fatal(err)
			}
			err = tc.learn(ctx, h)
			if !errors.Is(err, client.ErrHoldGone) {
				t.Fatalf("got %v, want ErrHoldGone", err)
			}
			if tc.name != "transferred away, Check" && status.Code(err) != codes.NotFound {
				t.Errorf("got code %v, want the server's NotFound kept", status.Code(err))
			}
			select {
			case <-h.Gone():
			default:
				t.Error("Gone not closed")
			}
			if h.Copies() != 0 {
				t.Errorf("copies %d, want 0", h.Copies())
			}
			if err := h.Check(ctx); !errors.Is(err, client.ErrHoldGone) && !errors.Is(err, client.ErrHoldClosed) {
				t.Errorf("Check again: %v, want ErrHoldGone (or ErrHoldClosed after ReleaseAll)", err)
			}
			if err := h.Close(); err != nil {
				t.Errorf("Close of a gone hold: %v, want nil", err)
			}
			select {
			case <-h.Lost():
				t.Error("a gone hold is not lost: its session lives")
			default:
			}
		})
	}
}

func transferAll(ctx context.Context, c charonv1.CharonClient, id string) error {
	_, err := c.Transfer(ctx, &charonv1.TransferRequest{HoldId: id})
	return err
}

func releaseAll(ctx context.Context, c charonv1.CharonClient, id string) error {
	_, err := c.Release(ctx, &charonv1.ReleaseRequest{HoldId: id})
	return err
}

// TestReleaseAllCountsTheServers: ReleaseAll releases what the server has,
// fewer copies than the hold counted when another client released some
// with its id, and says how many; a local hold counts its own.
func TestReleaseAllCountsTheServers(t *testing.T) {
	f := newFake()
	f.copyLimit[copyKey] = 5
	conn, _ := serve(t, f)
	c := client.New(conn, client.Options{})
	defer c.Close()
	ctx := context.Background()
	h := mustReserve(t, c, 3, 3)
	if _, err := charonv1.NewCharonClient(conn).Release(ctx, &charonv1.ReleaseRequest{HoldId: h.ID(), Copies: 1}); err != nil {
		t.Fatal(err)
	}
	n, err := h.ReleaseAll(ctx)
	if err != nil || n != 2 || h.Copies() != 0 || f.heldOf(copyKey) != 0 {
		t.Errorf("ReleaseAll: %d, %v, hold %d, server %d; want 2 released, nothing left", n, err, h.Copies(), f.heldOf(copyKey))
	}
	if _, err := h.ReleaseAll(ctx); !errors.Is(err, client.ErrHoldClosed) {
		t.Errorf("second ReleaseAll: %v, want ErrHoldClosed", err)
	}
	if err := h.Close(); err != nil {
		t.Errorf("Close after ReleaseAll: %v", err)
	}
}

func TestTransferSeize(t *testing.T) {
	f := newFake()
	f.copyLimit[copyKey] = 15
	conn, _ := serve(t, f)
	p1 := client.New(conn, client.Options{})
	defer p1.Close()
	p2 := client.New(conn, client.Options{})
	defer p2.Close()
	ctx := context.Background()

	h1, err := p1.Reserve(ctx, copyRes, 15, 15, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h1.Transfer(ctx, 16, 0); !errors.Is(err, client.ErrOverRelease) {
		t.Errorf("transfer 16 of 15: got %v, want ErrOverRelease", err)
	}
	tid, err := h1.Transfer(ctx, 10, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if h1.Copies() != 5 {
		t.Errorf("after transfer: %d copies, want 5", h1.Copies())
	}
	h2, err := p2.Seize(ctx, tid)
	if err != nil {
		t.Fatal(err)
	}
	if !h2.OK() || h2.Copies() != 10 || h2.Target().Resource != copyKey || h2.Seized() == nil {
		t.Errorf("seized: ok %v copies %d target %+v; want 10 of %s", h2.OK(), h2.Copies(), h2.Target(), copyKey)
	}
	if _, err := p2.Seize(ctx, tid); status.Code(err) != codes.NotFound {
		t.Errorf("second seize: got %v, want NOT_FOUND", err)
	}
	if err := h2.Release(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if got := f.heldOf(copyKey); got != 10 {
		t.Errorf("server holds %d, want 10", got)
	}
	// The seized hold belongs to p2's session: it dies with p2.
	f.mu.Lock()
	f.events = make(chan string, 10)
	f.mu.Unlock()
	if err := p2.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, h2.Lost(), "the seized hold to be lost")
	nextEvent(t, f, "the server to release the seized hold")
	if !errors.Is(h2.Err(), client.ErrClosed) {
		t.Errorf("Err = %v, want ErrClosed", h2.Err())
	}
	if err := h1.Close(); err != nil {
		t.Fatal(err)
	}
	if got := f.heldOf(copyKey); got != 0 {
		t.Errorf("server holds %d, want 0", got)
	}
	if _, err := p2.Reserve(ctx, copyRes, 1, 1, 0); !errors.Is(err, client.ErrClosed) {
		t.Errorf("reserve on a closed client: got %v, want ErrClosed", err)
	}
}

func TestReserveAll(t *testing.T) {
	r1, r2, r3 := client.R("a"), client.R("b"), client.R("c")
	ctx := context.Background()

	t.Run("trims to the smallest grant", func(t *testing.T) {
		f := newFake()
		f.copyLimit["a"], f.copyLimit["b"], f.copyLimit["c"] = 10, 4, 6
		c, _ := newClient(t, f, client.Options{})
		holds, err := c.ReserveAll(ctx, []client.Resource{r1, r2, r3}, 8, 2, 0)
		if err != nil {
			t.Fatal(err)
		}
		var got []int64
		for _, h := range holds {
			got = append(got, h.Copies())
		}
		if diff := cmp.Diff([]int64{4, 4, 4}, got); diff != "" {
			t.Errorf("copies (-want +got):\n%s", diff)
		}
		if a, b, c := f.heldOf("a"), f.heldOf("b"), f.heldOf("c"); a != 4 || b != 4 || c != 4 {
			t.Errorf("server holds a=%d b=%d c=%d, want 4 each", a, b, c)
		}
		for _, h := range holds {
			_ = h.Close()
		}
	})

	t.Run("rolls back on a rejection", func(t *testing.T) {
		f := newFake()
		f.copyLimit["a"], f.copyLimit["b"], f.copyLimit["c"] = 10, 10, 1
		c, clk := newClient(t, f, client.Options{})
		holds, err := c.ReserveAll(ctx, []client.Resource{r1, r2, r3}, 8, 2, 100*time.Millisecond)
		if !errors.Is(err, client.ErrRejected) || holds != nil {
			t.Fatalf("got %v, %v; want ErrRejected", holds, err)
		}
		if a, b, c := f.heldOf("a"), f.heldOf("b"), f.heldOf("c"); a+b+c != 0 {
			t.Errorf("server holds a=%d b=%d c=%d, want all released", a, b, c)
		}
		var total time.Duration
		for _, d := range clk.Sleeps() {
			total += d
		}
		if total != 100*time.Millisecond {
			t.Errorf("waited %v in all, want the shared 100ms", total)
		}
	})

	t.Run("rolls back on an error", func(t *testing.T) {
		f := newFake()
		f.copyLimit["a"] = 10
		c, _ := newClient(t, f, client.Options{FailOpen: true})
		_, err := c.ReserveAll(ctx, []client.Resource{r1, client.R("unknown")}, 3, 3, 0)
		if status.Code(err) != codes.NotFound {
			t.Errorf("got %v, want NOT_FOUND", err)
		}
		if got := f.heldOf("a"); got != 0 {
			t.Errorf("server holds %d of a, want 0", got)
		}
	})
}

func TestSessionLost(t *testing.T) {
	f, c, _ := fakeClient(t, 0, 5, client.Options{FailOpen: true})
	ctx := context.Background()
	h := mustReserve(t, c, 3, 3)
	f.mu.Lock()
	close(f.kill)
	f.kill = make(chan struct{})
	f.mu.Unlock()

	waitFor(t, h.Lost(), "the hold to be lost")
	if !errors.Is(h.Err(), client.ErrSessionLost) || status.Code(h.Err()) != codes.Unavailable {
		t.Errorf("Err = %v, want ErrSessionLost", h.Err())
	}
	if err := h.Release(ctx, 1); !errors.Is(err, client.ErrSessionLost) {
		t.Errorf("release of a lost hold: got %v, want ErrSessionLost", err)
	}
	if _, err := h.Transfer(ctx, 1, 0); !errors.Is(err, client.ErrSessionLost) {
		t.Errorf("transfer of a lost hold: got %v, want ErrSessionLost", err)
	}
	if err := h.Close(); err != nil {
		t.Errorf("close of a lost hold: %v", err)
	}
	if got := f.heldOf(copyKey); got != 0 {
		t.Errorf("server holds %d after the session ended, want 0", got)
	}
	// The next reserve opens a new session.
	h2, err := c.Reserve(ctx, copyRes, 5, 5, 0)
	if err != nil || !h2.OK() || h2.Degraded() {
		t.Fatalf("reserve after the loss: ok %v degraded %v, %v; want a server hold", h2.OK(), h2.Degraded(), err)
	}
	if err := h2.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestClientCloseReleasesHolds(t *testing.T) {
	f, c, _ := fakeClient(t, 0, 5, client.Options{})
	h := mustReserve(t, c, 5, 5)
	f.events = make(chan string, 10)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, h.Lost(), "the hold to be lost")
	nextEvent(t, f, "the server to release the session's hold")
	if got := f.heldOf(copyKey); got != 0 {
		t.Errorf("server holds %d, want 0", got)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestAbandonedReserveIsReleased(t *testing.T) {
	f, c, _ := fakeClient(t, 0, 5, client.Options{})
	f.gate = make(chan struct{})
	f.events = make(chan string, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	f.onCall = func() { cancel() }
	go func() {
		_, err := c.Reserve(ctx, copyRes, 2, 2, 0)
		done <- err
	}()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	close(f.gate) // the server grants after the caller gave up
	if ev := nextEvent(t, f, "the abandoned hold to be released"); ev != "release h1" {
		t.Errorf("event %q, want release h1", ev)
	}
	if got := f.heldOf(copyKey); got != 0 {
		t.Errorf("server holds %d, want 0", got)
	}
}

func TestConcurrentHolds(t *testing.T) {
	f, c, _ := fakeClient(t, 0, 20, client.Options{})
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := c.Reserve(ctx, copyRes, 2, 1, 0)
			if err != nil {
				errs <- err
				return
			}
			defer h.Close()
			if h.OK() && h.Copies() == 2 {
				if err := h.Release(ctx, 1); err != nil {
					errs <- fmt.Errorf("release: %w", err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := f.heldOf(copyKey); got != 0 {
		t.Errorf("server holds %d after every Close, want 0", got)
	}
}

func TestCallTimeoutFailsOpen(t *testing.T) {
	f, c, _ := fakeClient(t, 0, 5, client.Options{FailOpen: true, CallTimeout: 500 * time.Millisecond})
	f.events = make(chan string, 10)
	// Open the Session stream first: on a busy machine opening it can take
	// longer than the CallTimeout, and then the timed-out reserve never
	// reaches the server (a degraded hold with nothing to give back). Over
	// an open stream the reserve is sent unless its CallTimeout passes before
	// the stream's writer takes it (a call whose caller gave up is not sent):
	// the generous CallTimeout rules that out.
	for i := 0; ; i++ {
		h, err := c.Reserve(context.Background(), copyRes, 1, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		degraded := h.Degraded()
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
		if !degraded {
			<-f.events // its release
			break
		}
		if i == 1000 {
			t.Fatal("no Session stream opened in 1000 attempts")
		}
	}
	f.mu.Lock()
	f.gate = make(chan struct{})
	f.mu.Unlock()
	h, err := c.Reserve(context.Background(), copyRes, 4, 2, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !h.Degraded() || h.Copies() != 2 || !errors.Is(h.Err(), context.DeadlineExceeded) {
		t.Errorf("got degraded %v copies %d err %v; want a degraded hold of 2 after the call timed out",
			h.Degraded(), h.Copies(), h.Err())
	}
	f.mu.Lock()
	granted := f.seq // a timed-out warm-up reserve may still be granted and released late too
	f.mu.Unlock()
	close(f.gate) // the server grants late; the client gives it back
	for {
		f.mu.Lock()
		done := f.seq > granted && f.held[copyKey] == 0
		f.mu.Unlock()
		if done {
			break
		}
		select {
		case <-f.events:
		case <-time.After(30 * time.Second):
			t.Fatalf("the late grant was not released: server holds %d", f.heldOf(copyKey))
		}
	}
}
