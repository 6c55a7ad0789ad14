package client_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
	"github.com/charonlimit/charon/client"
)

var (
	rateRes = client.R("api", "user", "alice")
	copyRes = client.R("db", "tenant", "acme")
)

const (
	rateKey = "api/user=alice"
	copyKey = "db/tenant=acme"
)

// expectedSleeps replays the backoff of a rejected call with the same seed:
// after the i-th rejection, min(maxWait − elapsed, jitter(2^i × base)),
// 2^i × base capped at cap, until maxWait is spent.
func expectedSleeps(seed uint64, base, cap, maxWait, perCall time.Duration) []time.Duration {
	r := rand.New(rand.NewPCG(seed, 0))
	var out []time.Duration
	elapsed := perCall
	for i := 0; ; i++ {
		left := maxWait - elapsed
		if left <= 0 {
			return out
		}
		v := base
		for j := 0; j < i && v < cap; j++ {
			v *= 2
		}
		v = min(v, cap)
		d := v - v/4 + time.Duration(r.Int64N(int64(v/2)))
		d = min(d, left)
		out = append(out, d)
		elapsed += d + perCall
	}
}

func TestBackoffSchedule(t *testing.T) {
	for _, tc := range []struct {
		name                       string
		base, cap, maxWait, perRPC time.Duration
	}{
		{"defaults", 0, 0, time.Second, 0},
		{"capped", 10 * time.Millisecond, 40 * time.Millisecond, 300 * time.Millisecond, 0},
		{"slow server", 10 * time.Millisecond, time.Second, 2 * time.Second, 7 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, c, clk := fakeClient(t, 0, 0, client.Options{
				BackoffBase: tc.base, BackoffCap: tc.cap, Rand: rand.New(rand.NewPCG(42, 0)),
			})
			f.onCall = func() { clk.Advance(tc.perRPC) }
			res, err := c.Request(context.Background(), rateRes, 1, 1, tc.maxWait)
			if err != nil {
				t.Fatal(err)
			}
			if res.OK || res.Granted != 0 || res.Reply == nil {
				t.Errorf("got OK %v, granted %d, reply %v; want a rejection with its reply", res.OK, res.Granted, res.Reply)
			}
			base, cap := tc.base, tc.cap
			if base == 0 {
				base, cap = client.DefaultBackoffBase, client.DefaultBackoffCap
			}
			want := expectedSleeps(42, base, cap, tc.maxWait, tc.perRPC)
			got := clk.Sleeps()
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("sleeps (-want +got):\n%s", diff)
			}
			// Each sleep but the last is within [v − v/4, v + v/4); the
			// last is capped so that the wait ends at maxWait exactly.
			var total time.Duration
			for i, d := range got {
				v := min(base<<min(i, 40), cap)
				if i < len(got)-1 && (d < v-v/4 || d >= v+v/4) {
					t.Errorf("sleep %d = %v, want in [%v, %v)", i, d, v-v/4, v+v/4)
				}
				total += d
			}
			total += time.Duration(len(got)+1) * tc.perRPC
			if total < tc.maxWait {
				t.Errorf("waited %v in all, want >= maxWait %v", total, tc.maxWait)
			}
			if res.Attempts != len(got)+1 {
				t.Errorf("attempts = %d, want %d", res.Attempts, len(got)+1)
			}
			if res.Waited != clk.Now().Sub(newClock().Now()) {
				t.Errorf("waited = %v, want %v", res.Waited, clk.Now().Sub(newClock().Now()))
			}
			if last := got[len(got)-1]; res.Waited-tc.perRPC > tc.maxWait || last > cap+cap/4 {
				t.Errorf("last sleep %v, waited %v: want the wait to end at maxWait %v", last, res.Waited, tc.maxWait)
			}
		})
	}
}

func TestRetryUntilGranted(t *testing.T) {
	f, c, clk := fakeClient(t, 10, 0, client.Options{MaxWait: time.Minute})
	f.rejectN = 3
	res, err := c.Request(context.Background(), rateRes, 4, 2, client.UseDefault)
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK || res.Granted != 4 || res.Attempts != 4 || len(clk.Sleeps()) != 3 {
		t.Errorf("got OK %v granted %d attempts %d sleeps %v; want 4 granted on the 4th attempt after 3 sleeps",
			res.OK, res.Granted, res.Attempts, clk.Sleeps())
	}
	for i, d := range clk.Sleeps() {
		v := client.DefaultBackoffBase << i
		if d < v-v/4 || d >= v+v/4 {
			t.Errorf("sleep %d = %v, want in [%v, %v)", i, d, v-v/4, v+v/4)
		}
	}
}

// TestTriesOnce: a rejection is final, without a wait, when the caller
// gives no time to wait or the server says retrying will never help.
func TestTriesOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		never   bool
		maxWait time.Duration
	}{
		{"no wait", false, client.UseDefault},
		{"retry never", true, time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, c, clk := fakeClient(t, 0, 0, client.Options{})
			f.never = tc.never
			res, err := c.Request(context.Background(), rateRes, 1, 1, tc.maxWait)
			if err != nil {
				t.Fatal(err)
			}
			if res.OK || res.Attempts != 1 || len(clk.Sleeps()) != 0 {
				t.Errorf("got OK %v, attempts %d, sleeps %v; want one rejected attempt, no wait", res.OK, res.Attempts, clk.Sleeps())
			}
		})
	}
}

func TestHonorRetryAfter(t *testing.T) {
	f, c, clk := fakeClient(t, 0, 0, client.Options{HonorRetryAfter: true})
	f.retryAfter = 300 * time.Millisecond
	if _, err := c.Request(context.Background(), rateRes, 1, 1, time.Second); err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{300 * time.Millisecond, 300 * time.Millisecond, 300 * time.Millisecond, 100 * time.Millisecond}
	if diff := cmp.Diff(want, clk.Sleeps()); diff != "" {
		t.Errorf("sleeps (-want +got):\n%s", diff)
	}
}

func TestCanceledWhileWaiting(t *testing.T) {
	f, c, _ := fakeClient(t, 0, 0, client.Options{FailOpen: true})
	ctx, cancel := context.WithCancel(context.Background())
	f.onCall = cancel
	_, err := c.Request(ctx, rateRes, 1, 1, time.Hour)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled (never a degraded grant)", err)
	}
}

func TestFailOpen(t *testing.T) {
	for _, code := range []codes.Code{codes.Unavailable, codes.Internal, codes.DeadlineExceeded, codes.Unknown} {
		t.Run(code.String(), func(t *testing.T) {
			f := newFake()
			f.err = status.Error(code, "store down")
			c, clk := newClient(t, f, client.Options{FailOpen: true})
			ctx := context.Background()
			res, err := c.Request(ctx, rateRes, 10, 3, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if !res.OK || !res.Degraded || res.Granted != 3 || status.Code(res.Err) != code || res.Attempts != 1 {
				t.Errorf("request: got %+v; want a degraded grant of 3 after one attempt", res)
			}
			h, err := c.Reserve(ctx, copyRes, 10, 0, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if !h.OK() || !h.Degraded() || h.Copies() != 1 || h.ID() != "" || status.Code(h.Err()) != code {
				t.Errorf("reserve: got ok %v degraded %v copies %d id %q err %v; want a degraded hold of 1",
					h.OK(), h.Degraded(), h.Copies(), h.ID(), h.Err())
			}
			if err := h.Release(ctx, 1); err != nil || h.Copies() != 0 {
				t.Errorf("release of a degraded hold: %v, copies %d", err, h.Copies())
			}
			if _, err := h.Transfer(ctx, 1, 0); err == nil {
				t.Error("transfer of a degraded hold: got nil error")
			}
			if err := h.Close(); err != nil {
				t.Error(err)
			}
			if len(clk.Sleeps()) != 0 {
				t.Errorf("sleeps %v: a server error is not retried", clk.Sleeps())
			}
		})
	}
}

func TestServerErrorWithoutFailOpen(t *testing.T) {
	f := newFake()
	f.err = status.Error(codes.Unavailable, "store down")
	c, _ := newClient(t, f, client.Options{})
	if _, err := c.Request(context.Background(), rateRes, 1, 1, 0); status.Code(err) != codes.Unavailable {
		t.Errorf("request: got %v, want UNAVAILABLE", err)
	}
	if _, err := c.Reserve(context.Background(), copyRes, 1, 1, 0); status.Code(err) != codes.Unavailable {
		t.Errorf("reserve: got %v, want UNAVAILABLE", err)
	}
}

func TestUnreachableServerFailsOpen(t *testing.T) {
	f := newFake()
	conn, stop := serve(t, f)
	stop()
	c := client.New(conn, client.Options{FailOpen: true})
	defer c.Close()
	ctx := context.Background()
	res, err := c.Request(ctx, rateRes, 5, 0, 0)
	if err != nil || !res.Degraded || res.Granted != 1 {
		t.Errorf("request: got %+v, %v; want a degraded grant of 1", res, err)
	}
	h, err := c.Reserve(ctx, copyRes, 5, 2, 0)
	if err != nil || !h.Degraded() || h.Copies() != 2 {
		t.Fatalf("reserve: got %v; want a degraded hold of 2", err)
	}
	if !client.ServerError(h.Err()) {
		t.Errorf("Err = %v, want a server error", h.Err())
	}
}

func TestClientErrorsReturned(t *testing.T) {
	_, c, _ := fakeClient(t, 5, 5, client.Options{FailOpen: true})
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"request unknown", func() error { _, err := c.Request(ctx, client.R("nope"), 1, 1, 0); return err }, codes.NotFound},
		{"reserve unknown", func() error { _, err := c.Reserve(ctx, client.R("nope"), 1, 1, 0); return err }, codes.NotFound},
		{"request copy-limited", func() error { _, err := c.Request(ctx, copyRes, 1, 1, 0); return err }, codes.FailedPrecondition},
		{"reserve rate-limited", func() error { _, err := c.Reserve(ctx, rateRes, 1, 1, 0); return err }, codes.FailedPrecondition},
		{"seize unknown", func() error { _, err := c.Seize(ctx, "t999"); return err }, codes.NotFound},
	} {
		if err := tc.call(); status.Code(err) != tc.want || client.ServerError(err) {
			t.Errorf("%s: got %v, want %v returned", tc.name, err, tc.want)
		}
	}
	if _, err := c.Reserve(ctx, copyRes, 0, 0, 0); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("reserve 0 copies: got %v, want ErrInvalid", err)
	}
	if _, err := c.Request(ctx, rateRes, 1, 2, 0); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("request min > copies: got %v, want ErrInvalid", err)
	}
}

func TestKillSwitch(t *testing.T) {
	_, c, clk := fakeClient(t, 0, 0, client.Options{KillSwitch: true})
	ctx := context.Background()
	res, err := c.Request(ctx, rateRes, 7, 1, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK || !res.Forced || res.Granted != 7 || res.Reply == nil || res.Reply.GetOk() {
		t.Errorf("request: got %+v; want a forced grant of 7 with the server's rejection", res)
	}
	h, err := c.Reserve(ctx, copyRes, 4, 1, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !h.OK() || !h.Forced() || h.Copies() != 4 || h.ID() != "" {
		t.Errorf("reserve: got ok %v forced %v copies %d; want a forced hold of 4", h.OK(), h.Forced(), h.Copies())
	}
	if err := h.Close(); err != nil {
		t.Error(err)
	}
	if len(clk.Sleeps()) != 0 {
		t.Errorf("sleeps %v: the kill switch does not wait", clk.Sleeps())
	}

	c.SetKillSwitch(false)
	if c.KillSwitch() {
		t.Fatal("KillSwitch() = true after SetKillSwitch(false)")
	}
	res, err = c.Request(ctx, rateRes, 7, 1, 0)
	if err != nil || res.OK || res.Forced {
		t.Errorf("switch off: got %+v, %v; want a rejection", res, err)
	}
	h, err = c.Reserve(ctx, copyRes, 4, 1, 0)
	if err != nil || h.OK() || h.Forced() || h.Reply() == nil {
		t.Errorf("switch off: got hold ok %v forced %v, %v; want a rejection", h.OK(), h.Forced(), err)
	}
}

func TestDial(t *testing.T) {
	f := newFake()
	f.hitsLeft[rateKey] = 1
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	charonv1.RegisterCharonServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	c, err := client.Dial("passthrough:///bufnet", client.Options{},
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Request(context.Background(), rateRes, 1, 1, 0)
	if err != nil || !res.OK {
		t.Fatalf("got %+v, %v; want a grant", res, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Request(context.Background(), rateRes, 1, 1, 0); !errors.Is(err, client.ErrClosed) {
		t.Errorf("after Close: got %v, want ErrClosed", err)
	}
}
