package xdsconfig

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/charonlimit/charon/config"
)

// TypeURL is the type of the resources asked for: envoyproxy/ratelimit's
// RateLimitConfig.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// Defaults applied to zero Options fields.
const (
	// DefaultNodeID is envoyproxy/ratelimit's CONFIG_GRPC_XDS_NODE_ID
	// default: a control plane's snapshot for "default" serves every
	// replica.
	DefaultNodeID = "default"
	// DefaultMaxRecvMsgSize is gRPC's own default, stated.
	DefaultMaxRecvMsgSize = 4 << 20
	// DefaultNACKDelay is the least time between two NACKs.
	DefaultNACKDelay = 5 * time.Second
)

// maxErrorDetail bounds the text of a NACK's error_detail.
const maxErrorDetail = 16 << 10

// Options configure a Client. Addr, Load and Apply are required.
type Options struct {
	// Addr is the xDS server's gRPC target (host:port).
	Addr string
	// NodeID and NodeMetadata identify this client to the server (its
	// Node's id and string-valued metadata).
	NodeID       string
	NodeMetadata map[string]string
	// Headers are sent with the stream as gRPC metadata (an authorization
	// token, say). Their values are never logged.
	Headers map[string]string
	// TLS, when set, gives the TLS configuration of each new connection:
	// called once per connection, so that certificate files re-read there
	// are picked up at the next reconnection. Nil: plaintext.
	TLS func() (*tls.Config, error)
	// MaxRecvMsgSize is the largest DiscoveryResponse accepted.
	MaxRecvMsgSize int
	// Backoff is the wait before a new stream after one failed (zero:
	// DefaultBackoff).
	Backoff Backoff
	// NACKDelay is the least time between two NACKs: a server that sends
	// a rejected configuration again at once (go-control-plane's snapshot
	// cache does) gets its NACK no sooner, and the same resources are not
	// validated again.
	NACKDelay time.Duration

	// Load loads the files of one response (config.Load with the
	// server's options).
	Load func(fs.FS) (*config.Config, []config.Warning, error)
	// Apply puts a valid configuration and its version in force; it is
	// called from Run's goroutine, in order.
	Apply func(cfg *config.Config, version string)
	// Rejected, when set, is told of each configuration that did not load
	// (not of a rejected one sent again), after it was logged.
	Rejected func(version string, err error)

	Logger *slog.Logger // nil: discard
	// Now, After and Rand are the clock, the timers and the random draws
	// in [0, 1) (nil: the real ones).
	Now   func() time.Time
	After func(time.Duration) <-chan time.Time
	Rand  func() float64
}

// Stats count what a Client did.
type Stats struct {
	// Streams opened (successfully or not), responses received, ACKs
	// and NACKs sent.
	Streams, Responses, ACKs, NACKs int
	// Loads are the responses validated (a repeat of the resources last
	// applied or rejected is not).
	Loads int
}

// Client fetches RateLimitConfig resources from an xDS server over the
// Aggregated Discovery Service, State of the World, as envoyproxy/ratelimit
// does with CONFIG_TYPE=GRPC_XDS_SOTW, and applies each valid response as a
// whole. Use New, then Run; Version and Stats are safe for concurrent use.
type Client struct {
	opts Options
	log  *slog.Logger
	node *corev3.Node
	md   metadata.MD

	// Run's state.
	applied, rejected       [sha256.Size]byte
	hasApplied, hasRejected bool
	cfg                     *config.Config
	rejectErr               string
	lastNACK                time.Time

	mu      sync.Mutex
	version string
	stats   Stats
}

// New checks opts and returns a Client.
func New(opts Options) (*Client, error) {
	switch {
	case opts.Addr == "":
		return nil, errors.New("xdsconfig: Options.Addr is required")
	case opts.Load == nil || opts.Apply == nil:
		return nil, errors.New("xdsconfig: Options.Load and Apply are required")
	}
	if opts.NodeID == "" {
		opts.NodeID = DefaultNodeID
	}
	if opts.MaxRecvMsgSize <= 0 {
		opts.MaxRecvMsgSize = DefaultMaxRecvMsgSize
	}
	if opts.Backoff == (Backoff{}) {
		opts.Backoff = DefaultBackoff
	}
	if err := opts.Backoff.Check(); err != nil {
		return nil, fmt.Errorf("xdsconfig: backoff: %v", err)
	}
	if opts.NACKDelay <= 0 {
		opts.NACKDelay = DefaultNACKDelay
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.After == nil {
		opts.After = time.After
	}
	if opts.Rand == nil {
		opts.Rand = rand.Float64
	}
	c := &Client{opts: opts, log: opts.Logger, md: metadata.New(opts.Headers)}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	meta := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for k, v := range opts.NodeMetadata {
		meta.Fields[k] = structpb.NewStringValue(v)
	}
	c.node = &corev3.Node{Id: opts.NodeID, Metadata: meta, UserAgentName: "charon"}
	return c, nil
}

// Version returns the version of the configuration in force ("" before
// the first).
func (c *Client) Version() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.version
}

// Stats returns the counts so far.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

func (c *Client) count(f func(*Stats)) {
	c.mu.Lock()
	f(&c.stats)
	c.mu.Unlock()
}

// Run streams from the server until ctx is done, reconnecting after the
// Backoff when the server cannot be reached or the stream breaks (each
// break logged); the configuration in force stays meanwhile. It returns
// when ctx is done.
func (c *Client) Run(ctx context.Context) {
	for attempt := 0; ; attempt++ {
		got, err := c.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		if got {
			attempt = 0
		}
		wait := c.opts.Backoff.Wait(attempt, c.opts.Rand())
		c.log.Warn("xDS stream ended; reconnecting", "server", c.opts.Addr, "err", err.Error(), "after", wait)
		select {
		case <-ctx.Done():
			return
		case <-c.opts.After(wait):
		}
	}
}

// stream runs one connection and its stream until either fails or ctx is
// done; got reports whether it received a response.
func (c *Client) stream(ctx context.Context) (got bool, err error) {
	c.count(func(s *Stats) { s.Streams++ })
	creds := insecure.NewCredentials()
	if c.opts.TLS != nil {
		tc, err := c.opts.TLS()
		if err != nil {
			return false, err
		}
		creds = credentials.NewTLS(tc)
	}
	conn, err := grpc.NewClient(c.opts.Addr, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.opts.MaxRecvMsgSize)))
	if err != nil {
		return false, err
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ctx, c.md))
	defer cancel()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
	if err != nil {
		return false, err
	}
	return c.exchange(ctx, sctx, cancel, st)
}

// adsStream is the ADS stream of one connection.
type adsStream interface {
	Send(*discoveryv3.DiscoveryRequest) error
	Recv() (*discoveryv3.DiscoveryResponse, error)
}

// exchange sends requests on st and handles its responses until st fails
// or ctx is done. One goroutine receives, and only it calls st.Recv once
// it runs (gRPC allows one receiver at a time); cancel ends sctx, st's
// context, which ends that goroutine's Recv.
func (c *Client) exchange(ctx, sctx context.Context, cancel context.CancelFunc, st adsStream) (got bool, err error) {
	// The first request names the version in force, so that a server
	// whose version has not changed need not send it again.
	if err := st.Send(c.request(c.Version(), "", nil)); err != nil {
		return false, recvErr(st, err)
	}
	responses, errc := make(chan *discoveryv3.DiscoveryResponse), make(chan error, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		for {
			r, err := st.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case responses <- r:
			case <-sctx.Done():
				return
			}
		}
	})
	var pending *discoveryv3.DiscoveryRequest // a NACK held back until timer
	var timer <-chan time.Time
	for {
		var req *discoveryv3.DiscoveryRequest
		select {
		case <-ctx.Done():
			return got, ctx.Err()
		case err := <-errc:
			if err == io.EOF {
				err = errors.New("the server closed the stream")
			}
			return got, err
		case r := <-responses:
			got = true
			c.count(func(s *Stats) { s.Responses++ })
			// A response supersedes a NACK held back: that one's nonce
			// is stale.
			pending, timer = nil, nil
			var wait time.Duration
			req, wait = c.handle(r)
			if wait > 0 {
				pending, timer, req = req, c.opts.After(wait), nil
			}
		case <-timer:
			req, pending, timer = pending, nil, nil
		}
		if req == nil {
			continue
		}
		if req.ErrorDetail != nil {
			c.lastNACK = c.opts.Now()
			c.count(func(s *Stats) { s.NACKs++ })
		} else {
			c.count(func(s *Stats) { s.ACKs++ })
		}
		if err := st.Send(req); err != nil {
			return got, sendErr(ctx, err, responses, errc)
		}
	}
}

// sendErr is the stream's status after a Send failed with io.EOF (which
// hides it), as the receiving goroutine gets it; responses in flight are
// dropped, the stream being over.
func sendErr(ctx context.Context, err error, responses <-chan *discoveryv3.DiscoveryResponse, errc <-chan error) error {
	if err != io.EOF {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-responses:
		case rerr := <-errc:
			if rerr == io.EOF {
				return errors.New("the server closed the stream")
			}
			return rerr
		}
	}
}

// recvErr is the stream's status after its first Send failed with io.EOF
// (which hides it), before anything else receives.
func recvErr(st adsStream, err error) error {
	if err == io.EOF {
		if _, rerr := st.Recv(); rerr != nil && rerr != io.EOF {
			return rerr
		}
		return errors.New("the server closed the stream")
	}
	return err
}

// request is a DiscoveryRequest for TypeURL: an ACK of nonce, or with
// nack its NACK.
func (c *Client) request(version, nonce string, nack *status.Status) *discoveryv3.DiscoveryRequest {
	return &discoveryv3.DiscoveryRequest{Node: c.node, TypeUrl: TypeURL, VersionInfo: version, ResponseNonce: nonce, ErrorDetail: nack}
}

// handle judges a response and returns the ACK or NACK to send, and the
// wait before sending it (a NACK sent sooner than NACKDelay after the last).
func (c *Client) handle(r *discoveryv3.DiscoveryResponse) (*discoveryv3.DiscoveryRequest, time.Duration) {
	if r.GetTypeUrl() != TypeURL {
		c.log.Warn("xDS response of a type not asked for", "type", r.GetTypeUrl())
		return &discoveryv3.DiscoveryRequest{Node: c.node, TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce(),
			ErrorDetail: &status.Status{Code: int32(codes.InvalidArgument), Message: "not asked for: only " + TypeURL}}, c.nackWait()
	}
	version, sum := r.GetVersionInfo(), hashResources(r.GetResources())
	switch {
	case c.hasApplied && sum == c.applied:
		// The resources in force: nothing to load.
		if version != c.Version() {
			c.setVersion(version)
			c.opts.Apply(c.cfg, version)
		}
		return c.request(version, r.GetNonce(), nil), 0
	case c.hasRejected && sum == c.rejected:
		c.log.Debug("xDS configuration rejected before sent again", "version", version)
		return c.nack(r, c.rejectErr), c.nackWait()
	}
	c.count(func(s *Stats) { s.Loads++ })
	cfg, err := c.load(r.GetResources(), version)
	if err != nil {
		c.rejected, c.hasRejected, c.rejectErr = sum, true, err.Error()
		if c.opts.Rejected != nil {
			c.opts.Rejected(version, err)
		}
		return c.nack(r, c.rejectErr), c.nackWait()
	}
	c.applied, c.hasApplied, c.cfg, c.hasRejected = sum, true, cfg, false
	c.setVersion(version)
	c.opts.Apply(cfg, version)
	c.log.Info("config loaded", "source", "xds", "version", version, "resources", len(r.GetResources()))
	return c.request(version, r.GetNonce(), nil), 0
}

func (c *Client) setVersion(v string) {
	c.mu.Lock()
	c.version = v
	c.mu.Unlock()
}

// nackWait is how long a NACK sent now must wait.
func (c *Client) nackWait() time.Duration {
	if c.lastNACK.IsZero() {
		return 0
	}
	return max(0, c.lastNACK.Add(c.opts.NACKDelay).Sub(c.opts.Now()))
}

// nack is the NACK of r: the version in force, r's nonce, and why.
func (c *Client) nack(r *discoveryv3.DiscoveryResponse, why string) *discoveryv3.DiscoveryRequest {
	if len(why) > maxErrorDetail {
		why = why[:maxErrorDetail] + "…"
	}
	return c.request(c.Version(), r.GetNonce(), &status.Status{Code: int32(codes.InvalidArgument), Message: why})
}

// load decodes and loads the resources of one response, logging each
// problem and warning; the error's text names each problem's resource,
// domain and descriptor.
func (c *Client) load(resources []*anypb.Any, version string) (*config.Config, error) {
	res, err := Decode(resources)
	if err != nil {
		c.logRejected(version, err.Error())
		return nil, err
	}
	cfg, warns, err := c.opts.Load(res.Files)
	for _, w := range warns {
		c.log.Warn("config warning", "source", "xds", "version", version, "warning", w.String())
	}
	if err == nil && cfg == nil {
		err = errors.New("xdsconfig: the loader returned no configuration")
	}
	if err != nil {
		text := res.Explain(err)
		c.logRejected(version, text)
		return nil, errors.New(text)
	}
	return cfg, nil
}

func (c *Client) logRejected(version, text string) {
	msg := "config rejected"
	if c.hasApplied {
		msg = "config rejected; the last good configuration stays in force"
	}
	c.log.Error(msg, "source", "xds", "version", version, "err", text)
}

// hashResources identifies the resources of a response by their bytes,
// whatever their order (a snapshot cache may send them in any; the files
// load alike in every order).
func hashResources(rs []*anypb.Any) [sha256.Size]byte {
	sums := make([][sha256.Size]byte, len(rs))
	var n [8]byte
	for i, r := range rs {
		h := sha256.New()
		for _, b := range [][]byte{[]byte(r.GetTypeUrl()), r.GetValue()} {
			binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
			h.Write(n[:])
			h.Write(b)
		}
		copy(sums[i][:], h.Sum(nil))
	}
	slices.SortFunc(sums, func(a, b [sha256.Size]byte) int { return bytes.Compare(a[:], b[:]) })
	h := sha256.New()
	for _, s := range sums {
		h.Write(s[:])
	}
	var sum [sha256.Size]byte
	copy(sum[:], h.Sum(nil))
	return sum
}
