package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/charonlimit/charon/client"
)

// deafClient returns a fake, a client of it with opts, and a hold of 2
// copies reserved on the client's Session stream; then the fake stops
// reading that stream, as the real server does while it runs an operation
// that hangs. Its flow-control windows are fixed at gRPC's 64 KiB minimum,
// so that a few dozen KiB of requests fill them and the client's Send
// blocks. undeaf makes the fake read again; it runs before the client is
// closed at the end of the test, however the test ends.
func deafClient(t *testing.T, opts client.Options) (f *fake, c *client.Client, h *client.Hold, undeaf func()) {
	t.Helper()
	f = newFake()
	f.copyLimit[copyKey] = 10
	conn, _ := serve(t, f, grpc.InitialWindowSize(64<<10), grpc.InitialConnWindowSize(64<<10))
	c = client.New(conn, opts)
	t.Cleanup(func() { _ = c.Close() })
	h = mustReserve(t, c, 2, 2)
	deaf := make(chan struct{})
	f.mu.Lock()
	f.deaf = deaf
	f.events = make(chan string, 10)
	f.mu.Unlock()
	done := false
	undeaf = func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if !done {
			done = true
			f.deaf = nil
			close(deaf)
		}
	}
	t.Cleanup(undeaf)
	return f, c, h, undeaf
}

// floodOfReserves is how many concurrent reserves of a 1 KB value the tests
// make: 400 KB, several times what the fixed windows let through.
const floodOfReserves = 400

// flood runs floodOfReserves concurrent reserves, each with a context from
// newCtx, and returns their outcomes; the test fails if any is still
// blocked after generous seconds.
func flood(t *testing.T, c *client.Client, newCtx func() (context.Context, context.CancelFunc)) []reserveOutcome {
	t.Helper()
	r := client.R("db", "tenant", strings.Repeat("v", 1000))
	out := make(chan reserveOutcome, floodOfReserves)
	for range floodOfReserves {
		go func() {
			ctx, cancel := newCtx()
			defer cancel()
			h, err := c.Reserve(ctx, r, 1, 1, 0)
			out <- reserveOutcome{h, err}
		}()
	}
	guard := time.After(20 * time.Second)
	var got []reserveOutcome
	for len(got) < floodOfReserves {
		select {
		case o := <-out:
			got = append(got, o)
		case <-guard:
			t.Fatalf("%d of %d reserves still blocked; want each to end by its deadline", floodOfReserves-len(got), floodOfReserves)
		}
	}
	return got
}

type reserveOutcome struct {
	h   *client.Hold
	err error
}

// TestCallTimeoutWhenTheServerStopsReading: with the stream's flow control
// full, every reserve still ends by Options.CallTimeout and, with FailOpen,
// is a degraded grant; a release ends by its context's deadline; and
// Client.Close ends the stream without waiting for the server, which then
// releases the session's hold.
func TestCallTimeoutWhenTheServerStopsReading(t *testing.T) {
	f, c, h, _ := deafClient(t, client.Options{CallTimeout: 200 * time.Millisecond, FailOpen: true})

	for i, o := range flood(t, c, func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }) {
		if o.err != nil || !o.h.Degraded() || !errors.Is(o.h.Err(), context.DeadlineExceeded) {
			t.Fatalf("reserve %d: got %v; want a degraded hold after the call timed out", i, o.err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := h.Release(ctx, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("release: got %v, want context.DeadlineExceeded", err)
	}

	closed := make(chan struct{})
	go func() {
		_ = c.Close()
		close(closed)
	}()
	waitFor(t, closed, "Client.Close with the server not reading")
	waitFor(t, h.Lost(), "the hold to be lost")
	if !errors.Is(h.Err(), client.ErrClosed) {
		t.Errorf("Err = %v, want ErrClosed", h.Err())
	}
	nextEvent(t, f, "the server to release the session's hold")
	if got := f.heldOf(copyKey); got != 0 {
		t.Errorf("server holds %d, want 0", got)
	}
}

// TestDeadlineWhenTheServerStopsReading: with no CallTimeout, every reserve
// ends by its context's deadline with ctx.Err() (never a degraded grant);
// once the server reads again, the same stream carries on, its hold intact.
func TestDeadlineWhenTheServerStopsReading(t *testing.T) {
	f, c, h, undeaf := deafClient(t, client.Options{FailOpen: true})

	for i, o := range flood(t, c, func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 300*time.Millisecond)
	}) {
		if !errors.Is(o.err, context.DeadlineExceeded) || o.h != nil {
			t.Fatalf("reserve %d: got %v; want context.DeadlineExceeded", i, o.err)
		}
	}

	undeaf()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.Release(ctx, 1); err != nil {
		t.Fatalf("release once the server reads again: %v", err)
	}
	select {
	case <-h.Lost():
		t.Fatalf("hold lost: %v", h.Err())
	default:
	}
	if h.Copies() != 1 || f.heldOf(copyKey) != 1 {
		t.Errorf("hold %d, server %d; want 1, 1", h.Copies(), f.heldOf(copyKey))
	}
}

// TestOversizedRequestIsAClientError: a request larger than the server
// accepts would end the shared Session stream (gRPC refuses a message over
// its 4 MiB limit), releasing every hold on it. The client refuses it,
// sends nothing, and never fails open on it; the other holds live on.
func TestOversizedRequestIsAClientError(t *testing.T) {
	f, c, _ := fakeClient(t, 10, 10, client.Options{FailOpen: true})
	ctx := context.Background()
	h := mustReserve(t, c, 5, 5)
	huge := strings.Repeat("v", 5<<20)
	f.mu.Lock()
	calls := f.calls
	f.mu.Unlock()

	for _, tc := range []struct {
		name string
		call func() (granted bool, err error)
	}{
		{"reserve", func() (bool, error) {
			h, err := c.Reserve(ctx, client.R("db", "tenant", huge), 1, 1, 0)
			return h != nil, err
		}},
		{"request", func() (bool, error) {
			res, err := c.Request(ctx, client.R("api", "user", huge), 1, 1, 0)
			return res != nil, err
		}},
		{"seize", func() (bool, error) {
			h, err := c.Seize(ctx, huge)
			return h != nil, err
		}},
	} {
		if granted, err := tc.call(); !errors.Is(err, client.ErrInvalid) || granted {
			t.Errorf("%s: got granted %v, %v; want ErrInvalid", tc.name, granted, err)
		}
	}

	f.mu.Lock()
	sent := f.calls - calls
	f.mu.Unlock()
	if sent != 0 {
		t.Errorf("the server got %d calls; want none", sent)
	}
	select {
	case <-h.Lost():
		t.Fatalf("the first hold was lost: %v", h.Err())
	default:
	}
	if got := f.heldOf(copyKey); got != 5 {
		t.Errorf("server holds %d, want the first hold's 5", got)
	}
	if err := h.Release(ctx, 1); err != nil || f.heldOf(copyKey) != 4 {
		t.Errorf("release on the same stream: %v, server holds %d; want nil, 4", err, f.heldOf(copyKey))
	}
}
