package rls

import (
	"context"
	"crypto/tls"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/authz"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/offenders"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/internal/tlsconfig"
	"github.com/charonlimit/charon/internal/tlsconfig/tlstest"
	"github.com/charonlimit/charon/server"
	"github.com/charonlimit/charon/tiers"
)

// TestMain fails the package's tests if any goroutine outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testServer is a server serving the RLS service under test.
type testServer struct {
	*server.Server
	svc *Service
}

// newTestServer serves the RLS service of opts on a server of so, its
// listeners on free ports, deciding with so.Engine (a fakeEngine when
// nil). stop stops it and checks that Serve returned cleanly.
func newTestServer(t *testing.T, opts Options, so server.Options) (s *testServer, stop func()) {
	t.Helper()
	if so.Engine == nil {
		so.Engine = &fakeEngine{}
	}
	return serveService(t, New(so.Engine.(Decider), opts), so)
}

// testClock is the engine's injected clock, moved by hand.
type testClock struct{ ns atomic.Int64 }

func (c *testClock) Now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *testClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// testTree has domain c, with rate (3 per second in one burst tier), fast
// (a tier no test fills) and db (copies), and domain open, which allows
// descriptors it does not configure.
func testTree(t testing.TB) *descriptors.Tree {
	t.Helper()
	tree, err := descriptors.NewTree([]descriptors.DomainSpec{
		{Config: descriptors.DomainConfig{Name: "c"}, Nodes: []*descriptors.Node{
			{Key: "db", Limit: &descriptors.Limit{Copies: &descriptors.Copies{DomainLimit: 3}}},
			{Key: "rate", Limit: &descriptors.Limit{Policy: &tiers.Policy{Kind: tiers.KindTiers,
				Tiers: []tiers.Tier{{Limit: 3, Window: time.Second, Active: tiers.Unbounded}}}}},
			{Key: "fast", Limit: &descriptors.Limit{Policy: &tiers.Policy{Kind: tiers.KindTiers,
				Tiers: []tiers.Tier{{Limit: 1 << 40, Window: time.Second, Active: tiers.Unbounded}}}}},
		}},
		{Config: descriptors.DomainConfig{Name: "open", AllowUnconfigured: true}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tree
}

// testEngine is an engine over a memstore, with testTree and a test clock.
func testEngine(t *testing.T) (*engine.Engine, *testClock) {
	t.Helper()
	clock := &testClock{}
	clock.ns.Store(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { st.Close() })
	eng := engine.New(engine.Options{Store: st, Now: clock.Now})
	eng.SetTree(testTree(t))
	return eng, clock
}

// serveService serves svc on a server of so, as newTestServer does.
func serveService(t *testing.T, svc *Service, so server.Options) (s *testServer, stop func()) {
	t.Helper()
	so.GRPCAddr, so.HTTPAddr, so.DebugAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	srv, err := server.New(so, svc)
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	return &testServer{Server: srv, svc: svc}, func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}
}

// testMetrics are metrics on a registry of their own, for a Service a
// test calls without a server.
func testMetrics(t testing.TB) *metrics {
	t.Helper()
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// withTop is o tracking the top offenders over epochs of epoch.
func withTop(o Options, epoch time.Duration) Options {
	o.TopK, o.TopRules, o.TopEpoch = offenders.DefaultK, offenders.DefaultMaxRules, epoch
	return o
}

// metricValue reads a counter or a gauge.
func metricValue(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	if g := m.GetGauge(); g != nil {
		return g.GetValue()
	}
	return m.GetCounter().GetValue()
}

// mutualTLS makes certificates for a server named charon.test and a client
// named client, and the server's TLS config, which requires a client
// certificate of the CA.
func mutualTLS(t *testing.T, client string) (*tlstest.Mutual, *tls.Config) {
	t.Helper()
	m := tlstest.NewMutual(t, "charon.test", client)
	srv, err := tlsconfig.NewServer(tlsconfig.Options{CertFile: m.CertFile, KeyFile: m.KeyFile, ClientCAFile: m.CA.File})
	if err != nil {
		t.Fatal(err)
	}
	return m, srv.Config()
}

// httpsClient is an HTTPS client that trusts m's CA and presents a new
// certificate of it naming san.
func httpsClient(t *testing.T, m *tlstest.Mutual, san string) *http.Client {
	t.Helper()
	c, k := m.CA.Issue(t, m.Dir, strings.NewReplacer("/", "_", ":", "_").Replace(san), san)
	cfg, err := tlsconfig.Client(tlsconfig.ClientOptions{CAFile: m.CA.File, ServerName: m.ServerName, CertFile: c, KeyFile: k})
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}
}

func parseTable(t *testing.T, text string) *authz.Table {
	t.Helper()
	table, err := authz.Parse([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return table
}
