package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	charonv1 "github.com/charonlimit/charon/api/charon/v1"
)

// Defaults applied to zero Options fields.
const (
	DefaultBackoffBase  = 10 * time.Millisecond
	DefaultBackoffCap   = time.Second
	DefaultCloseTimeout = 5 * time.Second
)

// UseDefault as a maxWait argument stands for Options.MaxWait.
const UseDefault time.Duration = -1

// maxRequestSize bounds the encoded size of a request the client sends. A
// message over the server's gRPC receive limit (4 MiB by default) ends the
// whole Session stream, and with it every hold of the Client, so the client
// refuses an oversized request itself, as a client error. The server accepts
// a domain and at most 16 entries (descriptors.MaxEntries) whose key and
// value are at most 1024 bytes each (descriptors.MaxLen): with their
// protobuf framing, at most 1027 + 16 × (2 × 1027 + 3) = 33,939 bytes of
// resource, plus under 60 bytes of other fields. 64 KiB is well above any
// valid operation and far below the server's limit.
const maxRequestSize = 64 << 10

// checkSize refuses a request over maxRequestSize.
func checkSize(m proto.Message) error {
	if n := proto.Size(m); n > maxRequestSize {
		return fmt.Errorf("%w: request of %d bytes, more than %d (a domain, key or value over the server's limits)", ErrInvalid, n, maxRequestSize)
	}
	return nil
}

// Errors of the client itself. Errors the server answers are gRPC status
// errors (status.Code tells them apart) and are returned unchanged.
var (
	// ErrInvalid: an argument is out of range, or the request is over
	// 64 KiB encoded, far more than the server accepts (it would end the
	// Session stream); nothing was sent.
	ErrInvalid = errors.New("client: invalid argument")
	// ErrClosed: the Client was closed.
	ErrClosed = errors.New("client: closed")
	// ErrSessionLost: the Session stream that carried a call or a hold ended;
	// the server released the session's holds.
	ErrSessionLost = errors.New("client: session lost")
	// ErrHoldClosed: the hold was closed.
	ErrHoldClosed = errors.New("client: hold closed")
	// ErrOverRelease: more copies than the hold has.
	ErrOverRelease = errors.New("client: more copies than the hold has")
	// ErrLocalHold: the hold was granted by the client (degraded mode or kill
	// switch), not by a server, so it cannot be transferred.
	ErrLocalHold = errors.New("client: hold granted locally cannot be transferred")
	// ErrRejected: ReserveAll could not reserve one of its resources.
	ErrRejected = errors.New("client: rejected")
	// ErrHoldGone: the server no longer has the hold although its session
	// lives: another client transferred all its copies away, or released
	// them, with the hold's id. Nothing is left to release.
	ErrHoldGone = errors.New("client: hold gone")
)

// Options configure a Client. The zero value is usable: no waiting, errors
// returned (no degraded mode), kill switch off, the real clock.
type Options struct {
	// MaxWait is the wait of calls passed UseDefault: how long Request and
	// Reserve keep retrying a rejection. Zero (the paper's default) tries
	// once.
	MaxWait time.Duration

	// BackoffBase is the sleep after the first rejection before jitter; the
	// i-th rejection (from 0) sleeps about BackoffBase × 2^i, at most
	// BackoffCap. Zero: DefaultBackoffBase and DefaultBackoffCap.
	BackoffBase, BackoffCap time.Duration

	// HonorRetryAfter lengthens a backoff sleep to the server's retry_after
	// when that is longer (still capped by what is left of the wait). Off,
	// the sleeps follow the paper's formula exactly.
	HonorRetryAfter bool

	// FailOpen turns server errors (unreachable server, UNAVAILABLE,
	// INTERNAL, ...) of Request and Reserve into grants of the minimum,
	// marked Degraded (paper §4.3). Client errors are returned either way.
	FailOpen bool

	// KillSwitch is the initial state of the kill switch (SetKillSwitch).
	KillSwitch bool

	// TLS, when set, makes Dial connect over TLS with this configuration
	// (RootCAs for a private CA, Certificates for mutual TLS, ServerName);
	// nil means plain text. New ignores it: its connection is the caller's.
	TLS *tls.Config

	// CallTimeout bounds each attempt of Request and Reserve, so a server
	// that hangs counts as a server error (and FailOpen grants) instead of
	// blocking until the caller's deadline. Zero: no bound but ctx's.
	CallTimeout time.Duration

	// CloseTimeout bounds Hold.Close's release. Zero: DefaultCloseTimeout.
	CloseTimeout time.Duration

	// Lease is sent with every reserve and seize; the server ignores it on a
	// Session stream, where holds live as long as the stream. Zero: unset.
	Lease time.Duration

	// Now and Sleep are the clock: elapsed time is measured with Now, and
	// backoff sleeps call Sleep, which returns ctx.Err() if ctx ends first.
	// Nil: the real clock.
	Now   func() time.Time
	Sleep func(ctx context.Context, d time.Duration) error

	// Rand draws the jitter; it is used under the Client's lock. Nil: the
	// goroutine-safe top-level source of math/rand/v2.
	Rand *rand.Rand
}

// Client talks to a Charon server. Create it with New or Dial; it is safe for
// concurrent use. Rate requests are unary calls. Holds live on one Session
// stream per Client, opened at the first Reserve or Seize and reopened after
// it breaks; when it breaks, the server releases its holds and the client
// marks them lost (Hold.Lost).
type Client struct {
	rpc  charonv1.CharonClient
	opts Options
	conn *grpc.ClientConn // owned, closed by Close; nil from New

	kill atomic.Bool

	randMu sync.Mutex

	mu     sync.Mutex
	sess   *session
	closed bool
}

// New returns a Client calling conn, which the caller keeps and closes.
func New(conn grpc.ClientConnInterface, opts Options) *Client {
	if opts.BackoffBase <= 0 {
		opts.BackoffBase = DefaultBackoffBase
		if opts.BackoffCap <= 0 {
			opts.BackoffCap = DefaultBackoffCap
		}
	}
	if opts.BackoffCap < opts.BackoffBase {
		opts.BackoffCap = max(opts.BackoffBase, DefaultBackoffCap)
	}
	if opts.CloseTimeout <= 0 {
		opts.CloseTimeout = DefaultCloseTimeout
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Sleep == nil {
		opts.Sleep = sleep
	}
	c := &Client{rpc: charonv1.NewCharonClient(conn), opts: opts}
	c.kill.Store(opts.KillSwitch)
	return c
}

// Dial connects to target (e.g. "localhost:8081") over TLS with opts.TLS,
// else in plain text (dialOpts may say otherwise), with gRPC keepalive pings
// every 20s so a dead connection, and with it the session's holds, is
// noticed. Close closes the connection.
func Dial(target string, opts Options, dialOpts ...grpc.DialOption) (*Client, error) {
	transport := insecure.NewCredentials()
	if opts.TLS != nil {
		transport = credentials.NewTLS(opts.TLS)
	}
	all := append([]grpc.DialOption{
		grpc.WithTransportCredentials(transport),
		// The server refuses pings more often than every 10s.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 20 * time.Second, Timeout: 10 * time.Second}),
	}, dialOpts...)
	conn, err := grpc.NewClient(target, all...)
	if err != nil {
		return nil, fmt.Errorf("client: dial %s: %w", target, err)
	}
	c := New(conn, opts)
	c.conn = conn
	return c, nil
}

// SetKillSwitch turns the kill switch on or off, at any time: while it is on,
// every rejection is answered as a grant of all the copies asked (marked
// Forced), with no waiting. It is meant for incidents where the servers
// misbehave.
func (c *Client) SetKillSwitch(on bool) { c.kill.Store(on) }

// KillSwitch reports whether the kill switch is on.
func (c *Client) KillSwitch() bool { return c.kill.Load() }

// Close ends the Session stream, so the server releases every hold of this
// Client, marks those holds lost with ErrClosed, and closes the connection if
// Dial made it. Later calls fail with ErrClosed. Close is idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	s := c.sess
	c.sess = nil
	c.mu.Unlock()
	if s != nil {
		s.close()
	}
	if c.conn != nil {
		return c.conn.Close()
	}
	return nil
}

// Entry is one key and value of a descriptor.
type Entry struct{ Key, Value string }

// Resource addresses a resource as RLS does: an RLS domain and descriptor
// entries, resolved by the server's configuration.
type Resource struct {
	Domain  string
	Entries []Entry
}

// R builds a Resource from a domain and key, value pairs; a trailing key with
// no value gets the empty value.
func R(domain string, keyValues ...string) Resource {
	r := Resource{Domain: domain}
	for i := 0; i < len(keyValues); i += 2 {
		e := Entry{Key: keyValues[i]}
		if i+1 < len(keyValues) {
			e.Value = keyValues[i+1]
		}
		r.Entries = append(r.Entries, e)
	}
	return r
}

func (r Resource) proto() *charonv1.Resource {
	p := &charonv1.Resource{Domain: r.Domain}
	for _, e := range r.Entries {
		p.Entries = append(p.Entries, &charonv1.Entry{Key: e.Key, Value: e.Value})
	}
	return p
}

// String is the resource as domain/key=value/...; for messages.
func (r Resource) String() string {
	s := r.Domain
	for _, e := range r.Entries {
		s += "/" + e.Key + "=" + e.Value
	}
	return s
}

// Result is the answer to Request.
type Result struct {
	// OK: at least the minimum was granted (by the server, or by the client
	// when Degraded or Forced).
	OK bool
	// Granted hits; 0 when not OK.
	Granted int64
	// Degraded: the server could not answer (Err says why) and FailOpen
	// granted the minimum.
	Degraded bool
	Err      error
	// Forced: the server rejected and the kill switch granted all the hits
	// asked.
	Forced bool
	// Attempts made and time spent, backoff sleeps included.
	Attempts int
	Waited   time.Duration
	// Reply is the server's last answer with the decision context (on a
	// forced grant, the rejection); nil when Degraded.
	Reply *charonv1.RequestResponse
}

// Request asks for between min and copies hits of a rate-limited resource,
// retrying rejections for up to maxWait (UseDefault: Options.MaxWait) with
// exponential backoff and jitter (paper §3.2). A rejection is not an error:
// the Result is not OK. A rejection marked retry_never is not retried. If ctx
// ends first, the error is ctx.Err(). A resource far over the server's
// limits is ErrInvalid (see there), never a degraded grant.
func (c *Client) Request(ctx context.Context, r Resource, copies, min int64, maxWait time.Duration) (*Result, error) {
	if copies < 0 || min < 0 || min > copies {
		return nil, fmt.Errorf("%w: copies %d, min %d: want 0 <= min <= copies", ErrInvalid, copies, min)
	}
	if c.isClosed() {
		return nil, ErrClosed
	}
	req := &charonv1.RequestRequest{Resource: r.proto(), Copies: copies, MinCopies: min}
	if err := checkSize(req); err != nil {
		return nil, err
	}
	res := &Result{}
	try := func(ctx context.Context) (outcome, error) {
		ctx, cancel := c.attemptContext(ctx)
		defer cancel()
		reply, err := c.rpc.Request(ctx, req)
		if err != nil {
			return outcome{}, err
		}
		res.Reply = reply
		return outcome{ok: reply.GetOk(), never: reply.GetRetryNever(), retryAfter: reply.GetRetryAfter().AsDuration()}, nil
	}
	tr, err := c.attempt(ctx, maxWait, try)
	if err != nil {
		return nil, err
	}
	res.Attempts, res.Waited, res.Forced = tr.attempts, tr.waited, tr.forced
	switch {
	case tr.degraded != nil:
		res.Reply = nil
		res.Degraded, res.Err = true, tr.degraded
		res.OK, res.Granted = true, minimum(copies, min)
	case res.Forced:
		res.OK, res.Granted = true, copies
	default:
		res.OK, res.Granted = res.Reply.GetOk(), res.Reply.GetGranted()
	}
	return res, nil
}

// minimum is what a degraded grant gives: the least that lets the caller go
// on, at least one hit or copy when any was asked.
func minimum(copies, min int64) int64 {
	return clamp(max(min, 1), 0, copies)
}

func clamp(v, lo, hi int64) int64 { return max(lo, min(v, hi)) }

func (c *Client) maxWait(d time.Duration) time.Duration {
	if d < 0 {
		return max(c.opts.MaxWait, 0)
	}
	return d
}

// attemptContext bounds one attempt by Options.CallTimeout.
func (c *Client) attemptContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.opts.CallTimeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.opts.CallTimeout)
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// outcome is one attempt's answer as the retry loop needs it.
type outcome struct {
	ok, never  bool
	retryAfter time.Duration
}

// tries is how a call's attempts went.
type tries struct {
	attempts int
	waited   time.Duration
	// forced: the kill switch granted the last answer, a rejection.
	forced bool
	// degraded is the server error the client failed open on, if any.
	degraded error
}

// attempt retries try for up to maxWait (UseDefault: Options.MaxWait),
// granting a rejection when the kill switch is on. It returns the error to
// give the caller (ctx's own when it ended), or, when the client fails open
// on a server error, that error as degraded.
func (c *Client) attempt(ctx context.Context, maxWait time.Duration, try func(context.Context) (outcome, error)) (tries, error) {
	var tr tries
	var err error
	tr.attempts, tr.waited, err = c.retry(ctx, c.maxWait(maxWait), func(ctx context.Context) (outcome, error) {
		o, err := try(ctx)
		tr.forced = err == nil && !o.ok && c.KillSwitch()
		o.ok = o.ok || tr.forced
		return o, err
	})
	switch {
	case err == nil:
		return tr, nil
	case ctx.Err() != nil:
		return tr, ctx.Err()
	case c.failOpen(ctx, err):
		tr.degraded = err
		return tr, nil
	}
	return tr, err
}

// retry runs try until it grants, errs, says never, or maxWait is spent.
// After the i-th rejection (from 0) it sleeps
// min(maxWait − elapsed, jitter(2^i × base)), elapsed measured by Now, and
// gives up once that is ≤ 0, returning the last rejection.
func (c *Client) retry(ctx context.Context, maxWait time.Duration, try func(context.Context) (outcome, error)) (attempts int, waited time.Duration, err error) {
	start := c.opts.Now()
	for i := 0; ; i++ {
		o, err := try(ctx)
		elapsed := c.opts.Now().Sub(start)
		if err != nil || o.ok || o.never {
			return i + 1, elapsed, err
		}
		left := maxWait - elapsed
		if left <= 0 {
			return i + 1, elapsed, nil
		}
		d := c.jitter(c.step(i))
		if c.opts.HonorRetryAfter && o.retryAfter > d {
			d = o.retryAfter
		}
		if err := c.opts.Sleep(ctx, min(d, left)); err != nil {
			return i + 1, c.opts.Now().Sub(start), err
		}
	}
}

// step is base × 2^i, at most the cap.
func (c *Client) step(i int) time.Duration {
	d := c.opts.BackoffBase
	for ; i > 0 && d < c.opts.BackoffCap; i-- {
		d *= 2
	}
	return min(d, c.opts.BackoffCap)
}

// jitter draws uniformly in [v − v/4, v + v/4).
func (c *Client) jitter(v time.Duration) time.Duration {
	lo, hi := v-v/4, v+v/4
	if hi <= lo {
		return v
	}
	var n int64
	if c.opts.Rand != nil {
		c.randMu.Lock()
		n = c.opts.Rand.Int64N(int64(hi - lo))
		c.randMu.Unlock()
	} else {
		n = rand.Int64N(int64(hi - lo))
	}
	return lo + time.Duration(n)
}

// failOpen reports whether err, which ended a Request or Reserve, is a
// server error that degraded mode turns into a grant. The caller's own
// cancellation or deadline is never one.
func (c *Client) failOpen(ctx context.Context, err error) bool {
	return c.opts.FailOpen && ctx.Err() == nil && ServerError(err)
}

// ServerError reports whether err is the server's fault or the network's (the
// paper's "server error": degraded mode grants) rather than the request's
// (a "client error": returned to the caller).
//
//	server: UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, UNKNOWN, RESOURCE_EXHAUSTED,
//	        ABORTED, DATA_LOSS, UNIMPLEMENTED, CANCELED, ErrSessionLost,
//	        context.DeadlineExceeded (an attempt over Options.CallTimeout)
//	client: INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED,
//	        UNAUTHENTICATED, FAILED_PRECONDITION, OUT_OF_RANGE, and the
//	        client's own errors
func ServerError(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrSessionLost) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	if errors.Is(err, ErrClosed) || errors.Is(err, ErrInvalid) {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Internal, codes.Unknown,
		codes.ResourceExhausted, codes.Aborted, codes.DataLoss, codes.Unimplemented, codes.Canceled:
		return true
	}
	return false
}

func durationOrNil(d time.Duration) *durationpb.Duration {
	if d <= 0 {
		return nil
	}
	return durationpb.New(d)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
