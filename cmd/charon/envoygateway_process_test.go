package main

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
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
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"gopkg.in/yaml.v3"

	"github.com/charonlimit/charon/internal/redistest"
	"github.com/charonlimit/charon/internal/tlsconfig"
	"github.com/charonlimit/charon/internal/tlsconfig/tlstest"
)

// egProbe is a container probe of the Deployment.
type egProbe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port int    `yaml:"port"`
	} `yaml:"httpGet"`
}

// egDeployment is the part of Envoy Gateway's generated ratelimit
// Deployment (service/rls/testdata/envoygateway) that the process sees.
type egDeployment struct {
	Spec struct {
		Template struct {
			Spec struct {
				Containers []struct {
					Command []string `yaml:"command"`
					Env     []struct {
						Name  string `yaml:"name"`
						Value string `yaml:"value"`
					} `yaml:"env"`
					ReadinessProbe egProbe `yaml:"readinessProbe"`
					StartupProbe   egProbe `yaml:"startupProbe"`
					LivenessProbe  egProbe `yaml:"livenessProbe"`
				} `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// egRateLimitConfig is a RateLimitConfig of the shape Envoy Gateway's
// translator makes (its testdata out/ratelimit-config/distinct-match.yaml),
// with a second rule of 5 a minute for a token budget.
func egRateLimitConfig() *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: "default/eg/http", Domain: "default/eg/http", Descriptors: []*rlsconfv3.RateLimitDescriptor{{
		Key: "httproute/default/backend/rule/0", Value: "httproute/default/backend/rule/0",
		Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "rule-0-match-0", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: 3}},
			{Key: "rule-1-match-0", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 5}},
		},
	}}}
}

// TestEnvoyGatewayDeployment runs the binary with the command and
// environment of Envoy Gateway's generated ratelimit Deployment, as they
// are, but for what names the pod's surroundings: the certificate files
// (/certs), the mapping file (the vendored statsd_conf.yaml), the xDS
// server's and Redis' addresses, and the listeners (free loopback ports, as
// the test cannot bind the pod's). It starts healthy before any
// configuration (FORCE_START_WITHOUT_INITIAL_CONFIG), takes its limits from
// an xDS server over mutual TLS, serves RLS over TLS with Redis, passes the
// Deployment's probes and serves the mapped series on PROMETHEUS_ADDR. With
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false added, a token budget paid
// after the fact blocks the next check.
func TestEnvoyGatewayDeployment(t *testing.T) {
	bin := buildCharon(t)
	raw, err := os.ReadFile("../../service/rls/testdata/envoygateway/ratelimit-deployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var dep egDeployment
	if err := yaml.Unmarshal(raw, &dep); err != nil {
		t.Fatal(err)
	}
	c := dep.Spec.Template.Spec.Containers[0]
	if strings.Join(c.Command, " ") != "/bin/ratelimit" || c.ReadinessProbe.HTTPGet.Path != "/healthcheck" || c.ReadinessProbe.HTTPGet.Port != 8080 {
		t.Fatalf("the vendored Deployment changed: command %v, readiness probe %+v", c.Command, c.ReadinessProbe)
	}
	mapping, err := filepath.Abs("../../service/rls/testdata/envoygateway/statsd_conf.yaml")
	if err != nil {
		t.Fatal(err)
	}

	// /certs as Envoy Gateway's certgen fills it: one CA, one certificate
	// for the rate limit service (its server and its xDS client
	// certificate), and one for Envoy Gateway's xDS server.
	certs := t.TempDir()
	ca := tlstest.NewCA(t, certs, "ca")
	if err := os.Rename(ca.File, filepath.Join(certs, "ca.crt")); err != nil {
		t.Fatal(err)
	}
	ca.File = filepath.Join(certs, "ca.crt")
	ca.Issue(t, certs, "tls", "envoy-ratelimit", "127.0.0.1")
	egCert, egKey := ca.Issue(t, certs, "envoy-gateway", "127.0.0.1")

	// Envoy Gateway's xDS server, over mutual TLS.
	st, err := tlsconfig.NewServer(tlsconfig.Options{CertFile: egCert, KeyFile: egKey, ClientCAFile: ca.File})
	if err != nil {
		t.Fatal(err)
	}
	snapshots := cache.NewSnapshotCache(true, cache.IDHash{}, quietLog{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(st.Config())))
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(srv, xdsserver.NewServer(ctx, snapshots, nil))
	served := make(chan struct{})
	go func() { defer close(served); srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); cancel(); <-served })

	redisAddr := redistest.Single(t).Addr()
	env := func(extra ...string) []string {
		var out []string
		for _, e := range c.Env {
			v := strings.ReplaceAll(e.Value, "/certs/", certs+"/")
			switch e.Name {
			case "CONFIG_GRPC_XDS_SERVER_URL":
				v = lis.Addr().String()
			case "REDIS_URL":
				v = redisAddr
			case "PROMETHEUS_MAPPER_YAML":
				v = mapping
			}
			out = append(out, e.Name+"="+v)
		}
		return append(out, extra...)
	}

	for _, tc := range []struct {
		name  string
		extra []string
	}{
		{"as generated", nil},
		{"with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false", []string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snapshots.ClearSnapshot("envoy-ratelimit")
			metricsAddr := freeAddrs(t, 1)[0]
			// startServeEnv waits for /healthcheck: with force start the
			// process is healthy before Envoy Gateway sends anything.
			p := startServeEnv(t, bin, env(tc.extra...), "--metrics-addr", metricsAddr)
			for _, probe := range []string{c.ReadinessProbe.HTTPGet.Path, c.StartupProbe.HTTPGet.Path, c.LivenessProbe.HTTPGet.Path} {
				resp, err := http.Get("http://" + p.httpAddr + probe)
				if err != nil || resp.StatusCode != 200 {
					t.Fatalf("probe %s: %v %v", probe, resp, err)
				}
				resp.Body.Close()
			}
			// Plaintext gRPC is refused: the server is on TLS.
			plain, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer plain.Close()
			short, cancelShort := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancelShort()
			if _, err := rlsv3.NewRateLimitServiceClient(plain).ShouldRateLimit(short, &rlsv3.RateLimitRequest{Domain: "x"}); err == nil {
				t.Error("plaintext RLS answered")
			}
			// Envoy's side: TLS to the service, verifying it with the CA.
			cfg, err := tlsconfig.Client(tlsconfig.ClientOptions{CAFile: ca.File, ServerName: "envoy-ratelimit",
				CertFile: filepath.Join(certs, "tls.crt"), KeyFile: filepath.Join(certs, "tls.key")})
			if err != nil {
				t.Fatal(err)
			}
			cc, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(cfg.Clone())))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			rls := rlsv3.NewRateLimitServiceClient(cc)
			ask := func(rule, user string, hits *wrapperspb.UInt64Value) *rlsv3.RateLimitResponse {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "default/eg/http", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
					Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
						{Key: "httproute/default/backend/rule/0", Value: "httproute/default/backend/rule/0"}, {Key: rule, Value: user}},
					HitsAddend: hits,
				}}})
				if err != nil {
					t.Fatalf("ShouldRateLimit over TLS: %v\n%s", err, p.stderr.String())
				}
				return resp
			}
			if l := ask("rule-0-match-0", "u", nil).Statuses[0].CurrentLimit; l != nil {
				t.Fatalf("before any configuration: a limit %v", l)
			}

			// Envoy Gateway publishes its configuration for node
			// envoy-ratelimit (CONFIG_GRPC_XDS_NODE_ID).
			snap, err := cache.NewSnapshot("1", map[resource.Type][]types.Resource{resource.RateLimitConfigType: {egRateLimitConfig()}})
			if err != nil {
				t.Fatal(err)
			}
			if err := snapshots.SetSnapshot(context.Background(), "envoy-ratelimit", snap); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for ask("rule-0-match-0", "warmup", nil).Statuses[0].CurrentLimit == nil {
				if time.Now().After(deadline) {
					t.Fatalf("the xDS configuration not in force in time\n%s", p.stderr.String())
				}
				time.Sleep(20 * time.Millisecond)
			}
			user := strings.ReplaceAll(tc.name, " ", "-")
			for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK,
				rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
				if got := ask("rule-0-match-0", user, nil).OverallCode; got != want {
					t.Errorf("request %d of 3 an hour: %v, want %v", i+1, got, want)
				}
			}

			// The token budget of AI Gateway: a check at the request, the
			// usage at the response.
			check, four := wrapperspb.UInt64(0), wrapperspb.UInt64(4)
			ask("rule-1-match-0", user, check)
			ask("rule-1-match-0", user, four)
			if got := ask("rule-1-match-0", user, four).OverallCode; got != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Errorf("the report that overdraws: %v, want OVER_LIMIT", got)
			}
			next := ask("rule-1-match-0", user, check).OverallCode
			if postPaid := tc.extra != nil; postPaid && next != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Errorf("post-paid: the next check %v, want OVER_LIMIT (the budget is spent)", next)
			} else if !postPaid && next != rlsv3.RateLimitResponse_OK {
				t.Errorf("admission: the next check %v, want OK (the refused report counted nothing)", next)
			}

			// The mapped series on PROMETHEUS_ADDR (here --metrics-addr).
			body := get(t, "http://"+metricsAddr+"/metrics")
			for _, series := range []string{"ratelimit_service_rate_limit_over_limit", "ratelimit_service_rate_limit_total_hits"} {
				if !strings.Contains(body, series) {
					t.Errorf("%s missing from the mapped metrics", series)
				}
			}
			p.stop(t)
		})
	}
}
