package deploy

import (
	"sort"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load("helm/charon")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return c
}

// render renders the chart as `helm install charon -n charon` would, with
// values given as YAML over the chart's defaults.
func render(t *testing.T, c *chart.Chart, values string) ([]object, error) {
	t.Helper()
	var vals map[string]any
	if err := yaml.Unmarshal([]byte(values), &vals); err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(c, vals, chartutil.ReleaseOptions{Name: "charon", Namespace: "charon", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	out, err := engine.Render(c, rv)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(out))
	for n := range out {
		names = append(names, n)
	}
	sort.Strings(names)
	var objs []object
	for _, n := range names {
		if strings.HasSuffix(n, ".tpl") || strings.HasSuffix(n, "NOTES.txt") {
			continue
		}
		objs = append(objs, decodeObjects(t, n, []byte(out[n]))...)
	}
	return objs, nil
}

// TestHelmChart renders the chart over a matrix of values, decodes every
// object strictly into k8s.io/api types, and checks what the values ask for.
func TestHelmChart(t *testing.T) {
	c := loadChart(t)
	for _, tc := range []struct {
		name, values string
		check        func(t *testing.T, objs []object, d *appsv1.Deployment)
	}{
		{"defaults", ``, func(t *testing.T, objs []object, d *appsv1.Deployment) {
			if *d.Spec.Replicas != 1 || !hasArg(d, "--store=memory") {
				t.Errorf("defaults: %d replicas, args %v", *d.Spec.Replicas, d.Spec.Template.Spec.Containers[0].Args)
			}
			if d.Spec.Template.Spec.Containers[0].ReadinessProbe.GRPC == nil {
				t.Error("plaintext: the readiness probe is not gRPC health")
			}
			if _, ok := find[*policyv1.PodDisruptionBudget](objs, "PodDisruptionBudget", "charon"); !ok {
				t.Error("no PodDisruptionBudget")
			}
		}},
		{"redis with a URL", "store: redis\nreplicaCount: 3\nredis:\n  url: redis://redis:6379\n", func(t *testing.T, objs []object, d *appsv1.Deployment) {
			s, ok := find[*corev1.Secret](objs, "Secret", "charon-redis")
			if !ok || s.StringData["url"] != "redis://redis:6379" {
				t.Errorf("no Secret charon-redis with the URL: %v", s)
			}
			if !hasEnvFromSecret(d, "CHARON_REDIS_URL", "charon-redis", "url") || *d.Spec.Replicas != 3 {
				t.Error("CHARON_REDIS_URL does not come from the Secret, or not 3 replicas")
			}
		}},
		{"redis failureMode unavailable", "store: redis\nreplicaCount: 3\nredis:\n  url: redis://redis:6379\n  failureMode: unavailable\n", func(t *testing.T, objs []object, d *appsv1.Deployment) {
			c := d.Spec.Template.Spec.Containers[0]
			if !hasArg(d, "--failure-mode=unavailable") {
				t.Errorf("args %v lack --failure-mode=unavailable", c.Args)
			}
			// Readiness follows the store; liveness (checkDeployment) does not.
			if c.ReadinessProbe.GRPC == nil {
				t.Errorf("readiness %+v, want the gRPC health the store drives", c.ReadinessProbe.ProbeHandler)
			}
		}},
		{"redis password in the chart's Secret", "store: redis\nreplicaCount: 2\nredis:\n  url: redis://redis:6379\n  password: s3cret\n", func(t *testing.T, objs []object, d *appsv1.Deployment) {
			s, ok := find[*corev1.Secret](objs, "Secret", "charon-redis")
			if !ok || s.StringData["password"] != "s3cret" {
				t.Errorf("Secret charon-redis %v, want the password under password", s)
			}
			if !hasArg(d, "--redis-password-file=/etc/charon/redis/password") {
				t.Error("the password is not read from its file")
			}
		}},
		{"redis from an existing Secret", "store: redis\nreplicaCount: 2\nredis:\n  existingSecret: mine\n  urlKey: u\n  passwordKey: p\n", func(t *testing.T, objs []object, d *appsv1.Deployment) {
			if _, ok := find[*corev1.Secret](objs, "Secret", "charon-redis"); ok {
				t.Error("a Secret was made beside the existing one")
			}
			if !hasEnvFromSecret(d, "CHARON_REDIS_URL", "mine", "u") || !hasArg(d, "--redis-password-file=/etc/charon/redis/password") {
				t.Error("URL or password not taken from the existing Secret")
			}
		}},
		{"mutual TLS and authz", "tls:\n  secretName: charon-tls\n  clientCA: true\nauthz: |\n  clients:\n    - identity: spiffe://cluster.local/ns/istio-system/sa/gateway\n      allow: [rls]\n",
			func(t *testing.T, objs []object, d *appsv1.Deployment) {
				for _, a := range []string{"--grpc-tls-cert=/etc/charon/tls/tls.crt", "--grpc-tls-client-ca=/etc/charon/tls/ca.crt", "--authz=/etc/charon/authz/authz.yaml"} {
					if !hasArg(d, a) {
						t.Errorf("no %s", a)
					}
				}
				if p := d.Spec.Template.Spec.Containers[0].ReadinessProbe; p.HTTPGet == nil || p.HTTPGet.Path != "/healthcheck" {
					t.Errorf("TLS gRPC: readiness %+v, want HTTP /healthcheck", p.ProbeHandler)
				}
			}},
		{"TLS on HTTP too", "tls:\n  secretName: charon-tls\n  http: true\n", func(t *testing.T, objs []object, d *appsv1.Deployment) {
			if p := d.Spec.Template.Spec.Containers[0].ReadinessProbe; p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
				t.Errorf("readiness %+v, want HTTPS /healthcheck", p.ProbeHandler)
			}
		}},
		{"metrics with a ServiceMonitor and token", "metrics:\n  tokenSecret: scrape\n  serviceMonitor:\n    enabled: true\n    labels: {release: prom}\n",
			func(t *testing.T, objs []object, d *appsv1.Deployment) {
				sm, ok := find[*monitoringv1.ServiceMonitor](objs, "ServiceMonitor", "charon")
				if !ok || len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "metrics" || sm.Labels["release"] != "prom" {
					t.Fatalf("ServiceMonitor: %+v", sm)
				}
				if a := sm.Spec.Endpoints[0].Authorization; a == nil || a.Credentials == nil || a.Credentials.Name != "scrape" {
					t.Error("the ServiceMonitor does not send the token")
				}
				if !hasArg(d, "--debug-addr=:6070") || !hasArg(d, "--debug-token-file=/etc/charon/metrics/token") {
					t.Error("debug port not opened with the token")
				}
			}},
		{"no metrics, no PDB, resources", "metrics:\n  enabled: false\npodDisruptionBudget:\n  enabled: false\nresources:\n  requests: {cpu: 1, memory: 1Gi}\n  limits: {memory: 2Gi}\n",
			func(t *testing.T, objs []object, d *appsv1.Deployment) {
				if _, ok := find[*policyv1.PodDisruptionBudget](objs, "PodDisruptionBudget", "charon"); ok {
					t.Error("PodDisruptionBudget rendered while disabled")
				}
				if hasArg(d, "--debug-addr=:6070") {
					t.Error("debug port opened with metrics disabled")
				}
				if r := d.Spec.Template.Spec.Containers[0].Resources; r.Limits.Memory().String() != "2Gi" {
					t.Errorf("resources %+v", r)
				}
				if v, _ := envValue(d, "GOMEMLIMIT"); v != "1843MiB" {
					t.Errorf("GOMEMLIMIT %q, want 1843MiB (90%% of 2Gi)", v)
				}
			}},
		{"GOMEMLIMIT from a decimal limit", "resources:\n  requests: {cpu: 1, memory: 1G}\n  limits: {memory: 1G}\n", func(t *testing.T, objs []object, d *appsv1.Deployment) {
			if v, _ := envValue(d, "GOMEMLIMIT"); v != "858MiB" {
				t.Errorf("GOMEMLIMIT %q, want 858MiB (90%% of 1G)", v)
			}
		}},
		{"GOMEMLIMIT given", "goMemLimit: 400MiB\nmaxKeys: 100000\n", func(t *testing.T, objs []object, d *appsv1.Deployment) {
			if v, _ := envValue(d, "GOMEMLIMIT"); v != "400MiB" || !hasArg(d, "--max-keys=100000") {
				t.Errorf("GOMEMLIMIT %q, args %v; want 400MiB and --max-keys=100000", v, d.Spec.Template.Spec.Containers[0].Args)
			}
		}},
		{"charon's own --max-keys with a larger limit", "maxKeys: null\nresources:\n  requests: {cpu: 1, memory: 1Gi}\n  limits: {memory: 1Gi}\n", func(t *testing.T, objs []object, d *appsv1.Deployment) {
			if v, ok := serveSetting(d.Spec.Template.Spec.Containers[0], "max-keys"); ok {
				t.Errorf("--max-keys %s, want charon's default", v)
			}
		}},
		{"GOMEMLIMIT in env", "env:\n  GOMEMLIMIT: 420MiB\n", func(t *testing.T, objs []object, d *appsv1.Deployment) {
			n := 0
			for _, e := range d.Spec.Template.Spec.Containers[0].Env {
				if e.Name == "GOMEMLIMIT" {
					n++
				}
			}
			if v, _ := envValue(d, "GOMEMLIMIT"); v != "420MiB" || n != 1 {
				t.Errorf("GOMEMLIMIT %q in %d variables, want env's 420MiB once", v, n)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := render(t, c, tc.values)
			if err != nil {
				t.Fatal(err)
			}
			d, ok := find[*appsv1.Deployment](objs, "Deployment", "charon")
			svc, ok2 := find[*corev1.Service](objs, "Service", "charon")
			if !ok || !ok2 {
				t.Fatal("no Deployment or Service charon")
			}
			if grpcPort(svc) != 8081 {
				t.Errorf("Service charon: gRPC port %d, want 8081 (the EnvoyFilter's)", grpcPort(svc))
			}
			checkDeployment(t, tc.name, objs, d, svc)
			tc.check(t, objs, d)
		})
	}
}

// TestHelmChartSecureByDefault: under every combination of the TLS values
// (and a debug token), readiness is the probe docs/deployment.md names, and
// the debug port (/rlconfig, /explain) leaves loopback only when guarded, by
// a token or by TLS with client certificates and the authorization table;
// unguarded, metrics.enabled serves /metrics alone (--metrics-addr).
func TestHelmChartSecureByDefault(t *testing.T) {
	c := loadChart(t)
	const authz = "authz: 'clients: [{identity: spiffe://a, allow: [read]}]'\n"
	type probe string
	const (
		grpcHealth  probe = "gRPC health"
		httpHealth  probe = "HTTP /healthcheck"
		httpsHealth probe = "HTTPS /healthcheck"
		tcpHTTP     probe = "TCP connect to the HTTP port"
	)
	for _, tc := range []struct {
		name, values string
		probe        probe
		debugOpen    bool
	}{
		{"plaintext", "", grpcHealth, false},
		{"plaintext, metrics off", "metrics: {enabled: false}\n", grpcHealth, false},
		{"plaintext, token", "metrics: {tokenSecret: scrape}\n", grpcHealth, true},
		{"TLS gRPC", "tls: {secretName: s}\n", httpHealth, false},
		{"TLS gRPC and HTTP", "tls: {secretName: s, http: true}\n", httpsHealth, false},
		{"TLS debug without client CA", "tls: {secretName: s, debug: true}\n", httpHealth, false},
		{"mutual TLS", "tls: {secretName: s, clientCA: true}\n", httpHealth, false},
		{"mutual TLS, authz", "tls: {secretName: s, clientCA: true}\n" + authz, httpHealth, false},
		{"mutual TLS, authz, TLS debug", "tls: {secretName: s, clientCA: true, debug: true}\n" + authz, httpHealth, true},
		{"mutual TLS, TLS debug, no authz", "tls: {secretName: s, clientCA: true, debug: true}\n", httpHealth, false},
		{"mutual TLS and HTTP", "tls: {secretName: s, clientCA: true, http: true}\n", httpsHealth, false},
		{"mutual TLS everywhere, authz", "tls: {secretName: s, clientCA: true, http: true, debug: true}\n" + authz, httpsHealth, true},
		{"mutual TLS and HTTP, token", "tls: {secretName: s, clientCA: true, http: true}\nmetrics: {tokenSecret: scrape}\n", httpsHealth, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := render(t, c, tc.values)
			if err != nil {
				t.Fatal(err)
			}
			d, ok := find[*appsv1.Deployment](objs, "Deployment", "charon")
			if !ok {
				t.Fatal("no Deployment charon")
			}
			h := d.Spec.Template.Spec.Containers[0].ReadinessProbe.ProbeHandler
			var got probe
			switch {
			case h.GRPC != nil && h.GRPC.Port == 8081:
				got = grpcHealth
			case h.HTTPGet != nil && h.HTTPGet.Path == "/healthcheck" && h.HTTPGet.Port.String() == "http" && h.HTTPGet.Scheme == corev1.URISchemeHTTPS:
				got = httpsHealth
			case h.HTTPGet != nil && h.HTTPGet.Path == "/healthcheck" && h.HTTPGet.Port.String() == "http" && h.HTTPGet.Scheme != corev1.URISchemeHTTPS:
				got = httpHealth
			case h.TCPSocket != nil && h.TCPSocket.Port.String() == "http":
				got = tcpHTTP
			}
			if got != tc.probe {
				t.Errorf("readiness %+v, want %s", h, tc.probe)
			}
			metricsOn := !strings.Contains(tc.values, "enabled: false")
			if open := hasArg(d, "--debug-addr=:6070"); open != tc.debugOpen {
				t.Errorf("debug port on the pod network: %v, want %v (args %v)", open, tc.debugOpen, d.Spec.Template.Spec.Containers[0].Args)
			}
			if v, ok := serveSetting(d.Spec.Template.Spec.Containers[0], "debug-addr"); !tc.debugOpen && (!ok || !strings.HasPrefix(v, "127.0.0.1:")) {
				t.Errorf("--debug-addr=%s while unguarded, want a loopback address", v)
			}
			if alone := hasArg(d, "--metrics-addr=:6070"); alone != (metricsOn && !tc.debugOpen) {
				t.Errorf("/metrics alone at :6070: %v, want %v", alone, metricsOn && !tc.debugOpen)
			}
			if tls := hasArg(d, "--debug-tls"); tls != strings.Contains(tc.values, "debug: true") {
				t.Errorf("--debug-tls %v with values %q", tls, tc.values)
			}
		})
	}
}

// TestHelmChartRefuses: values that cannot work fail the render with a
// message saying why.
func TestHelmChartRefuses(t *testing.T) {
	c := loadChart(t)
	for _, tc := range []struct{ values, want string }{
		{"store: disk\n", `store "disk"`},
		{"store: redis\n", "redis.existingSecret or redis.url"},
		{"replicaCount: 3\n", "per pod"},
		{"authz: 'clients: []'\n", "authz needs tls.secretName and tls.clientCA"},
		{"tls: {http: true}\n", "need tls.secretName"},
		{"tls: {clientCA: true}\n", "need tls.secretName"},
		{"store: redis\nredis:\n  url: redis://r:6379\n  passwordKey: p\n", `redis.passwordKey "p" names a key of the chart's Secret`},
		{"store: redis\nredis:\n  existingSecret: mine\n  password: s3cret\n", "with redis.existingSecret, put the password in that Secret"},
		{"resources:\n  limits: {memory: 0.5Gi}\n", `resources.limits.memory "0.5Gi"`},
		{"metrics: {port: 7000, loopbackDebugPort: 7000}\n", "metrics.port and metrics.loopbackDebugPort are both 7000"},
	} {
		if _, err := render(t, c, tc.values); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error with %q", tc.values, err, tc.want)
		}
	}
}

func hasArg(d *appsv1.Deployment, arg string) bool {
	for _, a := range d.Spec.Template.Spec.Containers[0].Args {
		if a == arg {
			return true
		}
	}
	return false
}

// envValue is the value of the container's variable name.
func envValue(d *appsv1.Deployment, name string) (string, bool) {
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

func hasEnvFromSecret(d *appsv1.Deployment, name, secret, key string) bool {
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil &&
			e.ValueFrom.SecretKeyRef.Name == secret && e.ValueFrom.SecretKeyRef.Key == key {
			return true
		}
	}
	return false
}
