package server

import (
	"bufio"
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/charonlimit/charon/config"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// newTestServer serves the fake services (fakes_test.go) with opts, its
// listeners on free ports, over a fakeEngine unless opts name an engine.
func newTestServer(t *testing.T, opts Options) (*Server, func()) {
	t.Helper()
	opts.GRPCAddr, opts.HTTPAddr, opts.DebugAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	if opts.Engine == nil {
		opts.Engine = &fakeEngine{}
	}
	s, err := New(opts, &fakeRLS{}, &fakeCharon{})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	stop := func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}
	return s, stop
}

// dial connects to addr, in plaintext unless opts give other credentials.
func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	cc, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func TestHealthAndShutdown(t *testing.T) {
	s, stop := newTestServer(t, Options{})
	hc := healthpb.NewHealthClient(dial(t, s.GRPCAddr()))
	for _, svc := range []string{"", RLSServiceName} {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q: %v, %v; want SERVING", svc, r, err)
		}
	}
	body, code := get(t, "http://"+s.HTTPAddr()+"/healthcheck")
	if code != 200 || body != "OK" {
		t.Errorf("/healthcheck: %d %q", code, body)
	}
	stop()
	for _, svc := range []string{"", RLSServiceName} {
		r, err := s.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("after shutdown, health %q: %v, %v; want NOT_SERVING", svc, r, err)
		}
	}
	rec := &recorder{header: http.Header{}}
	s.serveHealthcheck(rec, nil)
	if rec.code != 500 {
		t.Errorf("/healthcheck while shutting down: %d, want 500", rec.code)
	}
}

type recorder struct {
	header http.Header
	code   int
	body   strings.Builder
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = 200
	}
	return r.body.Write(b)
}
func (r *recorder) WriteHeader(c int) { r.code = c }

func get(t *testing.T, url string) (string, int) {
	t.Helper()
	return fetch(t, "GET", url, "", "")
}

func post(t *testing.T, url, body string) (string, int) {
	t.Helper()
	return fetch(t, "POST", url, "", body)
}

// fetch makes an HTTP request and returns the response's body and status
// code. A token goes as a bearer token; a body is sent as JSON.
func fetch(t *testing.T, method, url, token, body string) (string, int) {
	t.Helper()
	return fetchWith(t, &http.Client{Timeout: 10 * time.Second}, method, url, token, body)
}

// fetchWith is fetch with the client hc.
func fetchWith(t *testing.T, hc *http.Client, method, url, token, body string) (string, int) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode
}

// fakeLoader loads every visible *.yaml file, refusing any that contains
// "invalid", and remembers what it saw.
type fakeLoader struct {
	mu   sync.Mutex
	seen []string // "name=content", sorted
}

func (l *fakeLoader) load(fsys fs.FS) (*config.Config, []config.Warning, error) {
	var seen []string
	var errs []error
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return nil
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), "invalid") {
			errs = append(errs, errors.New(p+":1: domain: invalid"))
		}
		seen = append(seen, p+"="+strings.TrimSpace(string(b)))
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	if len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}
	sort.Strings(seen)
	l.mu.Lock()
	l.seen = seen
	l.mu.Unlock()
	return &config.Config{}, nil, nil
}

func (l *fakeLoader) last() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.seen...)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// writeConfigMap lays files out as the kubelet does: a timestamped directory,
// a "..data" symlink to it, swapped atomically by rename, and one symlink per
// key pointing into "..data".
func writeConfigMap(t *testing.T, dir, version string, files map[string]string) {
	t.Helper()
	ts := filepath.Join(dir, "..2025_"+version)
	must(t, os.Mkdir(ts, 0o755))
	for name, content := range files {
		must(t, os.WriteFile(filepath.Join(ts, name), []byte(content), 0o644))
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); errors.Is(err, fs.ErrNotExist) {
			must(t, os.Symlink(filepath.Join("..data", name), link))
		}
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	must(t, os.Symlink("..2025_"+version, filepath.Join(dir, "..data_tmp")))
	must(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	if old != "" {
		must(t, os.RemoveAll(filepath.Join(dir, old)))
	}
}

func newTestReloader(t *testing.T, dir string) (*Reloader, *fakeLoader, *fakeEngine, *Metrics) {
	l, e, m := &fakeLoader{}, &fakeEngine{}, NewMetrics(nil)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	return NewReloader(dir, l.load, func(c *config.Config) { e.SetTree(c.Tree) }, m, log), l, e, m
}

func TestReloadConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	writeConfigMap(t, dir, "1", map[string]string{"rl.yaml": "v1"})
	r, l, e, m := newTestReloader(t, dir)

	step := func(name string, wantChanged, wantErr bool, wantSeen []string, wantTrees int) {
		t.Helper()
		changed, err := r.Check()
		if changed != wantChanged || (err != nil) != wantErr {
			t.Errorf("%s: Check = %v, %v; want changed %v, error %v", name, changed, err, wantChanged, wantErr)
		}
		if d := cmp.Diff(wantSeen, l.last()); d != "" {
			t.Errorf("%s: loaded files (-want +got):\n%s", name, d)
		}
		if e.trees != wantTrees {
			t.Errorf("%s: SetTree called %d times, want %d", name, e.trees, wantTrees)
		}
	}
	step("first", true, false, []string{"rl.yaml=v1"}, 1)
	step("unchanged", false, false, []string{"rl.yaml=v1"}, 1)
	writeConfigMap(t, dir, "2", map[string]string{"rl.yaml": "v2"})
	step("swap", true, false, []string{"rl.yaml=v2"}, 2)
	writeConfigMap(t, dir, "3", map[string]string{"rl.yaml": "invalid"})
	step("invalid swap", true, true, []string{"rl.yaml=v2"}, 2)
	step("invalid unchanged", false, false, []string{"rl.yaml=v2"}, 2)
	writeConfigMap(t, dir, "4", map[string]string{"rl.yaml": "v4", "other.yaml": "o"})
	step("fixed, new file", true, false, []string{"other.yaml=o", "rl.yaml=v4"}, 3)
	if r.Current() == nil {
		t.Error("no current config")
	}
	if got := testCounter(t, m, "success"); got != 3 {
		t.Errorf("reload successes %v, want 3", got)
	}
	if got := testCounter(t, m, "failure"); got != 1 {
		t.Errorf("reload failures %v, want 1", got)
	}
}

// TestReloadRuntimeLayout is envoyproxy/ratelimit's layout: RUNTIME_ROOT is a
// symlink swapped to a new version; the config is ROOT/SUBDIRECTORY/APPDIRECTORY.
func TestReloadRuntimeLayout(t *testing.T) {
	base := t.TempDir()
	for _, v := range []string{"v1", "v2"} {
		must(t, os.MkdirAll(filepath.Join(base, v, "ratelimit", "config"), 0o755))
		must(t, os.WriteFile(filepath.Join(base, v, "ratelimit", "config", "a.yaml"), []byte(v), 0o644))
	}
	must(t, os.Symlink("v1", filepath.Join(base, "current")))
	r, l, _, _ := newTestReloader(t, filepath.Join(base, "current", "ratelimit", "config"))
	if _, err := r.Check(); err != nil {
		t.Fatal(err)
	}
	must(t, os.Symlink("v2", filepath.Join(base, "next")))
	must(t, os.Rename(filepath.Join(base, "next"), filepath.Join(base, "current")))
	if changed, err := r.Check(); !changed || err != nil {
		t.Fatalf("after root swap: changed %v, err %v", changed, err)
	}
	if d := cmp.Diff([]string{"a.yaml=v2"}, l.last()); d != "" {
		t.Errorf("loaded (-want +got):\n%s", d)
	}
}

// TestReloadWatcher runs the real poller and waits, with a deadline, for it to
// pick up an edit in place.
func TestReloadWatcher(t *testing.T) {
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("one"), 0o644))
	l := &fakeLoader{}
	s, stop := newTestServer(t, Options{ConfigDir: dir, Load: l.load, PollInterval: 10 * time.Millisecond})
	defer stop()
	_ = s
	must(t, os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("two, longer"), 0o644))
	deadline := time.Now().Add(30 * time.Second)
	for {
		if got := l.last(); len(got) == 1 && got[0] == "a.yaml=two, longer" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("config not reloaded within 30 s; loaded %v", l.last())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestNewRefusesInvalidConfig(t *testing.T) {
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("invalid"), 0o644))
	l := &fakeLoader{}
	_, err := New(Options{GRPCAddr: "127.0.0.1:0", Engine: &fakeEngine{}, ConfigDir: dir, Load: l.load})
	if err == nil || !strings.Contains(err.Error(), "a.yaml:1") {
		t.Errorf("got %v, want an error naming a.yaml:1", err)
	}
}

func testCounter(t *testing.T, m *Metrics, result string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "charon_config_reloads_total" {
			continue
		}
		for _, mm := range mf.GetMetric() {
			for _, lp := range mm.GetLabel() {
				if lp.GetName() == "result" && lp.GetValue() == result {
					return mm.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestReloadRealLoader runs a ConfigMap swap through config.Load: the
// "..<timestamp>" directories stay hidden (no duplicate domain), a swap is
// seen, and an invalid file is refused with its file:line.
func TestReloadRealLoader(t *testing.T) {
	dir := t.TempDir()
	lyft := func(n int) string {
		return "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: " + strconv.Itoa(n) + "\n"
	}
	writeConfigMap(t, dir, "1", map[string]string{"rl.yaml": lyft(7)})
	load := func(fsys fs.FS) (*config.Config, []config.Warning, error) { return config.Load(fsys, config.Options{}) }
	e := &fakeEngine{}
	r := NewReloader(dir, load, func(c *config.Config) { e.SetTree(c.Tree) }, NewMetrics(nil), slog.New(slog.NewTextHandler(io.Discard, nil)))
	dump := func() string {
		t.Helper()
		b, err := r.Current().Dump()
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if _, err := r.Check(); err != nil {
		t.Fatalf("first load: %v", err)
	}
	if !strings.Contains(dump(), "limit: 7") {
		t.Errorf("dump lacks limit 7:\n%s", dump())
	}
	writeConfigMap(t, dir, "2", map[string]string{"rl.yaml": lyft(9)})
	if _, err := r.Check(); err != nil {
		t.Fatalf("after swap: %v", err)
	}
	if !strings.Contains(dump(), "limit: 9") {
		t.Errorf("dump lacks limit 9 after swap:\n%s", dump())
	}
	writeConfigMap(t, dir, "3", map[string]string{"rl.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n"})
	_, err := r.Check()
	if err == nil || !strings.Contains(err.Error(), "rl.yaml:") {
		t.Errorf("invalid config: got %v, want an error naming rl.yaml:line", err)
	}
	if !strings.Contains(dump(), "limit: 9") || e.trees != 2 {
		t.Errorf("the last good config did not stay (trees set %d times):\n%s", e.trees, dump())
	}
}

// TestSlowClientsCutOff: a client that sends part of a request and then
// nothing is disconnected after HTTPReadTimeout, on the HTTP port (a body
// that never comes) and the debug port (headers that never end).
func TestSlowClientsCutOff(t *testing.T) {
	s, stop := newTestServer(t, Options{HTTPReadTimeout: 200 * time.Millisecond})
	defer stop()
	for _, tc := range []struct{ addr, partial string }{
		{s.HTTPAddr(), "POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"domain\":"},
		{s.DebugAddr(), "GET /metrics HTTP/1.1\r\nHost: x\r\n"},
	} {
		c, err := net.Dial("tcp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, tc.partial); err != nil {
			t.Fatal(err)
		}
		// The server must close the connection long before this deadline
		// (which only keeps a broken server from hanging the test).
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, err = io.Copy(io.Discard, c)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Errorf("%s: a slow client was kept for 30 s", tc.addr)
		}
	}
}

// TestMaxConcurrentStreams: with one stream per connection, a call waits
// while a stream is open (and fails at its deadline), and goes through once
// the stream ends.
func TestMaxConcurrentStreams(t *testing.T) {
	s, stop := newTestServer(t, Options{MaxConcurrentStreams: 1})
	defer stop()
	cc := dial(t, s.GRPCAddr())
	health := healthpb.NewHealthClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	stCtx, endStream := context.WithCancel(ctx)
	st, err := health.Watch(stCtx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if _, err := health.Check(short, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("a second stream on a connection allowed one: %v, want DeadlineExceeded", err)
	}
	endStream()
	if _, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("after the stream ended: %v", err)
	}
}

// TestShutdownDelayDrains: once Serve's context is done, health is
// NOT_SERVING and /healthcheck 500 while decisions are still answered; the
// server stops after the delay. ErrStopNow skips the drain.
func TestShutdownDelayDrains(t *testing.T) {
	s, err := New(Options{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Engine: &fakeEngine{}, ShutdownDelay: time.Hour}, &fakeRLS{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	cc := dial(t, s.GRPCAddr())
	wait, cancelWait := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancelWait()
	health := healthpb.NewHealthClient(cc)
	if h, err := health.Check(wait, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("before: %v, %v", h, err)
	}
	cancel(nil)
	for {
		h, err := health.Check(wait, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if h.Status == healthpb.HealthCheckResponse_NOT_SERVING {
			break
		}
	}
	resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(wait, &rlsv3.RateLimitRequest{Domain: "d",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "x")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("a decision while draining: %v, %v", resp, err)
	}
	hr, err := http.Get("http://" + s.HTTPAddr() + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(bufio.NewReader(hr.Body))
	hr.Body.Close()
	if hr.StatusCode != http.StatusInternalServerError {
		t.Errorf("/healthcheck while draining: %d %s, want 500", hr.StatusCode, body)
	}
	select {
	case err := <-done:
		t.Fatalf("Serve returned during the drain: %v", err)
	default:
	}
	s.EndDrain()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}

	// A second server: ErrStopNow stops it at once despite an hour's delay.
	s2, err := New(Options{GRPCAddr: "127.0.0.1:0", Engine: &fakeEngine{}, ShutdownDelay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancelCause(context.Background())
	done2 := make(chan error, 1)
	go func() { done2 <- s2.Serve(ctx2) }()
	cancel2(ErrStopNow)
	select {
	case err := <-done2:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("ErrStopNow did not skip the drain")
	}
}

// TestEmptyConfigIsLoud: a configuration directory with no domain (empty,
// or a mount that missed) serves, and says at WARN, on the HTTP and debug
// index pages and in /rlconfig that every request is answered OK; a domain
// file added later silences it.
func TestEmptyConfigIsLoud(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(writerFunc(func(b []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(b)
	}), nil))
	load := func(fsys fs.FS) (*config.Config, []config.Warning, error) { return config.Load(fsys, config.Options{}) }
	s, stop := newTestServer(t, Options{ConfigDir: dir, Load: load, PollInterval: 10 * time.Millisecond, Logger: log})
	defer stop()
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "every request is answered OK") || !strings.Contains(out, dir) {
		t.Errorf("no warning naming the directory:\n%s", out)
	}
	for _, url := range []string{"http://" + s.HTTPAddr() + "/", "http://" + s.DebugAddr() + "/", "http://" + s.DebugAddr() + "/rlconfig"} {
		if body, code := get(t, url); code != 200 || !strings.Contains(body, "every request is answered OK") || !strings.Contains(body, dir) {
			t.Errorf("GET %s: %d, no word of the empty configuration:\n%s", url, code, body)
		}
	}
	must(t, os.WriteFile(filepath.Join(dir, "api.yaml"), []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644))
	deadline := time.Now().Add(30 * time.Second)
	for {
		body, _ := get(t, "http://"+s.DebugAddr()+"/rlconfig")
		if strings.Contains(body, "domain: api") {
			if strings.Contains(body, "answered OK") {
				t.Errorf("/rlconfig still warns with a domain loaded:\n%s", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the domain file was not loaded within 30 s:\n%s", body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if body, _ := get(t, "http://"+s.HTTPAddr()+"/"); strings.Contains(body, "Warning") {
		t.Errorf("the HTTP index still warns with a domain loaded")
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

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
