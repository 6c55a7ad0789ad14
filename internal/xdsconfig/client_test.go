package xdsconfig_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	xdsserver "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/internal/tlsconfig"
	"github.com/charonlimit/charon/internal/tlsconfig/tlstest"
	"github.com/charonlimit/charon/internal/xdsconfig"
	"github.com/charonlimit/charon/server"
	rlsservice "github.com/charonlimit/charon/service/rls"
)

const nodeID = "charon-test"

// quiet is go-control-plane's logger, silent.
type quiet struct{}

func (quiet) Debugf(string, ...any) {}
func (quiet) Infof(string, ...any)  {}
func (quiet) Warnf(string, ...any)  {}
func (quiet) Errorf(string, ...any) {}

// xdsServer is go-control-plane's SotW ADS server over a snapshot cache,
// on loopback, recording the requests it receives.
type xdsServer struct {
	cache cache.SnapshotCache
	addr  string
	grpc  *grpc.Server
	done  chan struct{}

	mu      sync.Mutex
	reqs    []*discoveryv3.DiscoveryRequest
	headers []metadata.MD
}

// startXDS serves on addr ("127.0.0.1:0" for any port), over TLS when tc
// is set; the test's cleanup stops it.
func startXDS(t *testing.T, addr string, tc *tls.Config) *xdsServer {
	t.Helper()
	x := &xdsServer{cache: cache.NewSnapshotCache(true, cache.IDHash{}, quiet{}), done: make(chan struct{})}
	x.listen(t, addr, tc)
	return x
}

func (x *xdsServer) listen(t *testing.T, addr string, tc *tls.Config) {
	t.Helper()
	var lis net.Listener
	var err error
	// A restarted server takes its old address back; the port can take a
	// moment to be free again.
	deadline := time.Now().Add(10 * time.Second)
	for lis, err = net.Listen("tcp", addr); err != nil && time.Now().Before(deadline); lis, err = net.Listen("tcp", addr) {
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	var opts []grpc.ServerOption
	if tc != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	x.grpc, x.addr, x.done = grpc.NewServer(opts...), lis.Addr().String(), make(chan struct{})
	cb := xdsserver.CallbackFuncs{
		StreamOpenFunc: func(ctx context.Context, _ int64, _ string) error {
			md, _ := metadata.FromIncomingContext(ctx)
			x.mu.Lock()
			x.headers = append(x.headers, md)
			x.mu.Unlock()
			return nil
		},
		StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
			x.mu.Lock()
			x.reqs = append(x.reqs, r)
			x.mu.Unlock()
			return nil
		},
	}
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(x.grpc, xdsserver.NewServer(context.Background(), x.cache, cb))
	srv, done := x.grpc, x.done
	go func() {
		defer close(done)
		srv.Serve(lis)
	}()
	t.Cleanup(func() { srv.Stop(); <-done })
}

// stop stops the server, cutting its streams.
func (x *xdsServer) stop() {
	x.grpc.Stop()
	<-x.done
}

// set publishes version with configs for nodeID.
func (x *xdsServer) set(t *testing.T, version string, configs ...*rlsconfv3.RateLimitConfig) {
	t.Helper()
	rs := make([]types.Resource, len(configs))
	for i, c := range configs {
		rs[i] = c
	}
	snap, err := cache.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: rs})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.cache.SetSnapshot(context.Background(), nodeID, snap); err != nil {
		t.Fatal(err)
	}
}

// requests returns the requests received so far.
func (x *xdsServer) requests() []*discoveryv3.DiscoveryRequest {
	x.mu.Lock()
	defer x.mu.Unlock()
	return slices.Clone(x.reqs)
}

// nacks counts the NACKs received.
func (x *xdsServer) nacks() int {
	n := 0
	for _, r := range x.requests() {
		if r.GetErrorDetail() != nil {
			n++
		}
	}
	return n
}

// limited is a RateLimitConfig of domain "d": key k, n requests a minute.
func limited(name string, n uint32) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: name, Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "k", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: n}},
	}}
}

// invalid is a RateLimitConfig that does not load: a limit without a unit.
func invalid(name string) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: name, Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "k", RateLimit: &rlsconfv3.RateLimitPolicy{RequestsPerUnit: 5}},
	}}
}

// rls is a Charon server fed by an xDS client.
type rls struct {
	srv    *server.Server
	client *xdsconfig.Client
	rc     rlsv3.RateLimitServiceClient
	hc     healthpb.HealthClient

	mu       sync.Mutex
	rejected []string
}

// startRLS starts a server that waits for its first configuration and an
// xDS client of x feeding it, with opts' other settings; the test's
// cleanup stops both and checks that the client's Run returned.
func startRLS(t *testing.T, opts xdsconfig.Options) *rls {
	t.Helper()
	mem := memstore.New(memstore.Options{})
	t.Cleanup(func() { mem.Close() })
	eng := engine.New(engine.Options{Store: mem})
	srv, err := server.New(server.Options{GRPCAddr: "127.0.0.1:0", Engine: eng, WaitForConfig: true}, rlsservice.New(eng, rlsservice.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	r := &rls{srv: srv}
	opts.NodeID = nodeID
	opts.Load = func(fsys fs.FS) (*config.Config, []config.Warning, error) { return config.Load(fsys, config.Options{}) }
	opts.Apply = func(cfg *config.Config, version string) { srv.ApplyConfig(cfg, "xds", version) }
	opts.Rejected = func(version string, err error) {
		srv.ConfigRejected()
		r.mu.Lock()
		r.rejected = append(r.rejected, version+": "+err.Error())
		r.mu.Unlock()
	}
	if opts.Backoff == (xdsconfig.Backoff{}) {
		opts.Backoff = xdsconfig.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond, Factor: 2}
	}
	if r.client, err = xdsconfig.New(opts); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served, ran := make(chan error, 1), make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	go func() { r.client.Run(ctx); close(ran) }()
	t.Cleanup(func() {
		cancel()
		<-ran
		<-served
	})
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r.rc, r.hc = rlsv3.NewRateLimitServiceClient(conn), healthpb.NewHealthClient(conn)
	return r
}

// ask sends one request for d/k and returns its overall code.
func (r *rls) ask(t *testing.T) rlsv3.RateLimitResponse_Code {
	t.Helper()
	resp, err := r.rc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp.GetOverallCode()
}

// allowed counts the requests granted out of n.
func (r *rls) allowed(t *testing.T, n int) int {
	t.Helper()
	ok := 0
	for range n {
		if r.ask(t) == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	return ok
}

func (r *rls) health(t *testing.T) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	h, err := r.hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: server.RLSServiceName})
	if err != nil {
		t.Fatal(err)
	}
	return h.GetStatus()
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestFirstConfigAndUpdate: the server waits, NOT_SERVING, for its first
// configuration; the first snapshot is applied, ACKed and answers; an
// update is applied in turn; the node and headers reach the server.
func TestFirstConfigAndUpdate(t *testing.T) {
	x := startXDS(t, "127.0.0.1:0", nil)
	r := startRLS(t, xdsconfig.Options{Addr: x.addr, NodeMetadata: map[string]string{"zone": "a"},
		Headers: map[string]string{"Authorization": "Bearer t0ken"}})
	if st := r.health(t); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("before the first config: %v, want NOT_SERVING", st)
	}
	if _, err := r.rc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d"}); status.Code(err) != codes.Unavailable {
		t.Errorf("ShouldRateLimit before the first config: %v, want UNAVAILABLE", err)
	}
	x.set(t, "1", limited("limits", 2))
	waitFor(t, "version 1", func() bool { return r.client.Version() == "1" })
	// The version is the client's; the server applies the config after it.
	waitFor(t, "SERVING after the first config", func() bool { return r.health(t) == healthpb.HealthCheckResponse_SERVING })
	if got := r.allowed(t, 4); got != 2 {
		t.Errorf("version 1 (2 a minute): %d of 4 allowed", got)
	}
	waitFor(t, "the ACK of version 1", func() bool {
		reqs := x.requests()
		last := reqs[len(reqs)-1]
		return last.GetVersionInfo() == "1" && last.GetResponseNonce() != "" && last.GetErrorDetail() == nil
	})
	x.set(t, "2", limited("limits", 10))
	waitFor(t, "version 2", func() bool { return r.client.Version() == "2" })
	// The new limit applies to the 2 counted under version 1.
	if got := r.allowed(t, 4); got != 4 {
		t.Errorf("version 2 (10 a minute, 2 used): %d of 4 allowed", got)
	}
	// The same resources under a new version: the version changes, nothing
	// is loaded again.
	x.set(t, "3", limited("limits", 10))
	waitFor(t, "version 3", func() bool { return r.client.Version() == "3" })
	if got := r.allowed(t, 7); got != 4 {
		t.Errorf("version 3 (the same 10 a minute, 6 used): %d of 7 allowed", got)
	}
	first := x.requests()[0]
	if n := first.GetNode(); n.GetId() != nodeID || n.GetMetadata().GetFields()["zone"].GetStringValue() != "a" || first.GetTypeUrl() != xdsconfig.TypeURL {
		t.Errorf("first request: node %v, type %s", n, first.GetTypeUrl())
	}
	x.mu.Lock()
	auth := x.headers[0].Get("authorization")
	x.mu.Unlock()
	if !slices.Equal(auth, []string{"Bearer t0ken"}) {
		t.Errorf("authorization header: %q", auth)
	}
	if s := r.client.Stats(); s.NACKs != 0 || s.Loads != 2 {
		t.Errorf("stats %+v: want 2 loads and no NACK", s)
	}
}

// fakeClock is the clock and timers of a client: time moves only by
// Advance.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []waiter
}

type waiter struct {
	at time.Time
	c  chan time.Time
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) After(d time.Duration) <-chan time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := make(chan time.Time, 1)
	if d <= 0 {
		c <- f.now
		return c
	}
	f.waiters = append(f.waiters, waiter{f.now.Add(d), c})
	return c
}

// waiting counts the timers not yet fired.
func (f *fakeClock) waiting() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.waiters)
}

func (f *fakeClock) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	f.waiters = slices.DeleteFunc(f.waiters, func(w waiter) bool {
		if w.at.After(f.now) {
			return false
		}
		w.c <- f.now
		return true
	})
}

// TestNACKKeepsLastGoodAndDoesNotSpin: an invalid version is NACKed with
// its problems and the last good configuration keeps answering; the
// snapshot cache sends it straight back after each NACK, and the client
// answers at most one NACK per NACKDelay of its clock, validating it once;
// a corrected version is then taken.
func TestNACKKeepsLastGoodAndDoesNotSpin(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	x := startXDS(t, "127.0.0.1:0", nil)
	const delay = 5 * time.Second
	r := startRLS(t, xdsconfig.Options{Addr: x.addr, NACKDelay: delay, Now: clock.Now, After: clock.After})
	x.set(t, "1", limited("limits", 2))
	waitFor(t, "version 1", func() bool { return r.client.Version() == "1" })

	x.set(t, "2", limited("limits", 2), invalid("broken"))
	// The first NACK goes at once; the server sends version 2 again, and
	// the next NACK waits for the clock.
	waitFor(t, "a NACK held back", func() bool { return x.nacks() == 1 && clock.waiting() == 1 })
	reqs := x.requests()
	nack := reqs[len(reqs)-1]
	if nack.GetVersionInfo() != "1" || !strings.Contains(nack.GetErrorDetail().GetMessage(), `resource "broken" (domain "d"): descriptors[0]{k}.rate_limit`) {
		t.Errorf("NACK: version %q, error %q", nack.GetVersionInfo(), nack.GetErrorDetail().GetMessage())
	}
	if r.client.Version() != "1" {
		t.Errorf("version in force: %q, want 1", r.client.Version())
	}
	if got := r.allowed(t, 3); got != 2 {
		t.Errorf("the last good version (2 a minute): %d of 3 allowed", got)
	}
	for i := 2; i <= 4; i++ {
		clock.Advance(delay - time.Millisecond)
		if n := x.nacks(); n != i-1 {
			t.Fatalf("before NACKDelay: %d NACKs, want %d", n, i-1)
		}
		clock.Advance(time.Millisecond)
		waitFor(t, fmt.Sprintf("NACK %d held back", i), func() bool { return x.nacks() == i && clock.waiting() == 1 })
	}
	if s := r.client.Stats(); s.Loads != 2 || s.NACKs != 4 {
		t.Errorf("stats %+v: want 2 loads (versions 1 and 2 once each) and 4 NACKs", s)
	}
	r.mu.Lock()
	if len(r.rejected) != 1 || !strings.HasPrefix(r.rejected[0], "2: ") {
		t.Errorf("rejections reported: %q, want version 2 once", r.rejected)
	}
	r.mu.Unlock()

	// The server has no request to answer until the held NACK goes.
	fixed := limited("fixed", 2)
	fixed.Domain = "e"
	x.set(t, "3", limited("limits", 2), fixed)
	clock.Advance(delay)
	waitFor(t, "version 3", func() bool { return r.client.Version() == "3" })
}

// TestReconnect: the xDS server goes away and comes back on the same
// address with a new snapshot; the configuration in force keeps answering
// meanwhile, and the client reconnects and takes the new one.
func TestReconnect(t *testing.T) {
	x := startXDS(t, "127.0.0.1:0", nil)
	r := startRLS(t, xdsconfig.Options{Addr: x.addr})
	x.set(t, "1", limited("limits", 1))
	waitFor(t, "version 1", func() bool { return r.client.Version() == "1" })
	x.stop()
	waitFor(t, "the stream to break", func() bool { return r.client.Stats().Streams >= 2 })
	if got := r.allowed(t, 2); got != 1 {
		t.Errorf("while the server is down (1 a minute): %d of 2 allowed", got)
	}
	y := &xdsServer{cache: cache.NewSnapshotCache(true, cache.IDHash{}, quiet{})}
	y.set(t, "7", limited("limits", 50))
	y.listen(t, x.addr, nil)
	waitFor(t, "version 7 from the restarted server", func() bool { return r.client.Version() == "7" })
	if got := r.allowed(t, 3); got != 3 {
		t.Errorf("version 7 (50 a minute): %d of 3 allowed", got)
	}
}

// TestMutualTLS: the client presents its certificate and verifies the
// server's against the CA, under the server name given; without a client
// certificate the server refuses it and nothing is applied.
func TestMutualTLS(t *testing.T) {
	m := tlstest.NewMutual(t, "xds.test", "charon")
	st, err := tlsconfig.NewServer(tlsconfig.Options{CertFile: m.CertFile, KeyFile: m.KeyFile, ClientCAFile: m.CA.File})
	if err != nil {
		t.Fatal(err)
	}
	x := startXDS(t, "127.0.0.1:0", st.Config())
	x.set(t, "1", limited("limits", 3))

	anon := startRLS(t, xdsconfig.Options{Addr: x.addr, TLS: func() (*tls.Config, error) {
		return tlsconfig.Client(tlsconfig.ClientOptions{CAFile: m.CA.File, ServerName: "xds.test"})
	}})
	r := startRLS(t, xdsconfig.Options{Addr: x.addr, TLS: func() (*tls.Config, error) {
		return tlsconfig.Client(tlsconfig.ClientOptions{CAFile: m.CA.File, CertFile: m.ClientCertFile, KeyFile: m.ClientKeyFile, ServerName: "xds.test"})
	}})
	waitFor(t, "version 1 over mutual TLS", func() bool { return r.client.Version() == "1" })
	if got := r.allowed(t, 4); got != 3 {
		t.Errorf("version 1 (3 a minute): %d of 4 allowed", got)
	}
	waitFor(t, "the client without a certificate to try twice", func() bool { return anon.client.Stats().Streams >= 2 })
	if v := anon.client.Version(); v != "" {
		t.Errorf("a client without a certificate got version %q", v)
	}
	if st := anon.health(t); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("its server: %v, want NOT_SERVING", st)
	}
}

// TestNewRefuses: the required options.
func TestNewRefuses(t *testing.T) {
	load := func(fs.FS) (*config.Config, []config.Warning, error) { return nil, nil, errors.New("x") }
	apply := func(*config.Config, string) {}
	for _, o := range []xdsconfig.Options{
		{Load: load, Apply: apply},
		{Addr: "h:1", Apply: apply},
		{Addr: "h:1", Load: load, Apply: apply, Backoff: xdsconfig.Backoff{Initial: time.Second}},
	} {
		if _, err := xdsconfig.New(o); err == nil {
			t.Errorf("%+v: accepted", o)
		}
	}
}
