//go:build linux

package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	yamlv3 "gopkg.in/yaml.v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The install paths started as a user starts them: the chart rendered over a
// matrix of values, the Kubernetes manifests and the compose file, each
// Charon container run with its rendered command line against the built
// binary in a pod of its own until its probes pass, then asked what its user
// asks: a rate limit answer, /metrics where the pod declares it, the debug
// page on loopback, and nothing of the debug port open to the pod network
// without credentials.

const (
	podToken = "s3cret-scrape-token"
	// clientID is the identity of the test's client certificate.
	clientID = "spiffe://cluster.local/ns/test/sa/client"
)

// TestHelmChartStarts renders the chart and starts each rendering's
// container command line.
func TestHelmChartStarts(t *testing.T) {
	c := loadChart(t)
	tlsSecret, cliCert, cliKey := tlsFiles(t, clientID)
	authz := "authz: |\n  clients:\n    - identity: " + clientID + "\n      allow: [rls, read]\n"
	for _, tc := range []struct {
		name, values string
		redis        bool
	}{
		{"defaults", "", false},
		{"store redis", "store: redis\nreplicaCount: 2\nredis:\n  url: redis://127.0.0.1:6379\n  password: pw-in-secret\n", true},
		{"TLS, client CA, tls.http", "tls: {secretName: charon-tls, clientCA: true, http: true}\n", false},
		{"metrics token", "metrics: {tokenSecret: scrape}\n", false},
		{"metrics disabled", "metrics: {enabled: false}\n", false},
		{"dashboards and alerts", "dashboards: {enabled: true}\nalerts: {prometheusRule: {enabled: true}}\nmetrics: {serviceMonitor: {enabled: true}}\n", false},
		{"mutual TLS everywhere, authz", "tls: {secretName: charon-tls, clientCA: true, http: true, debug: true}\n" + authz, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := render(t, c, tc.values)
			if err != nil {
				t.Fatal(err)
			}
			// What the user creates beside the chart.
			objs = append(objs,
				object{kind: "Secret", name: "charon-tls", value: &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "charon-tls"}, Data: tlsSecret}},
				object{kind: "Secret", name: "scrape", value: &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "scrape"}, StringData: map[string]string{"token": podToken}}})
			d, ok := find[*appsv1.Deployment](objs, "Deployment", "charon")
			if !ok {
				t.Fatal("no Deployment charon")
			}
			p := newPod(t, objs)
			if tc.redis {
				startRedis(t, p, "--requirepass", string(p.secretData("charon-redis")["password"]))
			}
			ct := p.start(d.Spec.Template.Spec, d.Spec.Template.Spec.Containers[0], charonBin(t))
			p.waitReady(ct)
			checkCharonPod(t, p, ct, podCreds{token: podToken, ca: tlsSecret["ca.crt"], cert: cliCert, key: cliKey})
		})
	}
}

// TestKubernetesManifestsStart starts deploy/kubernetes's Charon (and, for
// redis.yaml, its Redis, reached by its Service name).
func TestKubernetesManifestsStart(t *testing.T) {
	for _, variant := range []string{"memory.yaml", "redis.yaml"} {
		t.Run(variant, func(t *testing.T) {
			objs := decodeObjects(t, "base.yaml", readFile(t, "kubernetes/base.yaml"))
			objs = append(objs, decodeObjects(t, variant, readFile(t, "kubernetes/"+variant))...)
			p := newPod(t, objs, "charon-redis.charon.svc.cluster.local", "charon-redis")
			if r, ok := find[*appsv1.Deployment](objs, "Deployment", "charon-redis"); ok {
				rc := r.Spec.Template.Spec.Containers[0]
				redisBin := lookRedis(t)
				// The image's entrypoint is redis-server; the pod runs it as its
				// user, in a directory of its own.
				rc.Command = []string{redisBin}
				rc.Args = append(rc.Args, "--bind", "127.0.0.1", "--port", "6379")
				rct := p.start(r.Spec.Template.Spec, rc, redisBin)
				p.waitReady(rct)
			}
			d, _ := find[*appsv1.Deployment](objs, "Deployment", "charon")
			ct := p.start(d.Spec.Template.Spec, d.Spec.Template.Spec.Containers[0], charonBin(t))
			p.waitReady(ct)
			checkCharonPod(t, p, ct, podCreds{})
		})
	}
}

// TestComposeStarts starts the compose file's Charon (charon-1) with its
// command, environment and volumes, beside its Redis (the service redis).
func TestComposeStarts(t *testing.T) {
	var f composeFile
	dec := yamlv3.NewDecoder(bytes.NewReader(readFile(t, "compose/docker-compose.yaml")))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		t.Fatal(err)
	}
	svc := f.Services["charon-1"]
	var ps corev1.PodSpec
	ct := corev1.Container{Name: "charon-1", Args: svc.Command,
		// The image's EXPOSE, and its HEALTHCHECK as a probe.
		Ports:          []corev1.ContainerPort{{ContainerPort: 8081}, {ContainerPort: 8080}, {ContainerPort: 6070}},
		ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: 8081}}}}
	user := int64(65532) // the image's USER
	ct.SecurityContext = &corev1.SecurityContext{RunAsUser: &user, RunAsGroup: &user}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range svc.Environment {
			if !yield(k) {
				return
			}
		}
	}) {
		ct.Env = append(ct.Env, corev1.EnvVar{Name: k, Value: svc.Environment[k]})
	}
	for i, v := range svc.Volumes {
		parts := strings.Split(v, ":")
		src, err := filepath.Abs(filepath.Join("compose", parts[0]))
		if err != nil {
			t.Fatal(err)
		}
		name := "v" + strconv.Itoa(i)
		ps.Volumes = append(ps.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: src}}})
		ct.VolumeMounts = append(ct.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: parts[1]})
	}
	p := newPod(t, nil, "redis")
	redis := f.Services["redis"]
	if len(redis.Command) == 0 || redis.Command[0] != "redis-server" {
		t.Fatalf("the compose file's redis runs %v, want redis-server", redis.Command)
	}
	startRedis(t, p, redis.Command[1:]...)
	c := p.start(ps, ct, charonBin(t))
	p.waitReady(c)
	checkCharonPod(t, p, c, podCreds{})
}

// lookRedis finds redis-server, or skips (fails under CHARON_REQUIRE_REDIS).
func lookRedis(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CHARON_REQUIRE_REDIS") != "" {
			t.Fatal("redis-server not found and CHARON_REQUIRE_REDIS is set")
		}
		t.Skip("redis-server not found")
	}
	return bin
}

// startRedis runs redis-server at 127.0.0.1:6379 in the pod, where the
// pod's Redis URL points.
func startRedis(t *testing.T, p *pod, args ...string) {
	t.Helper()
	bin := lookRedis(t)
	c := corev1.Container{Name: "redis", Command: append([]string{bin}, args...),
		ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{}}}}
	c.ReadinessProbe.TCPSocket.Port.IntVal = 6379
	c.Command = append(c.Command, "--bind", "127.0.0.1", "--port", "6379", "--save", "", "--appendonly", "no")
	p.waitReady(p.start(corev1.PodSpec{}, c, bin))
}

// podCreds are what the test holds to call a pod: the debug token, the CA
// and a client certificate.
type podCreds struct {
	token         string
	ca, cert, key []byte
}

// checkCharonPod asks a ready Charon container what its users ask.
func checkCharonPod(t *testing.T, p *pod, c *container, creds podCreds) {
	t.Helper()
	args := c.cmd.Args
	has := func(prefix string) bool {
		return slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, prefix) })
	}
	files := t.TempDir()
	os.Chmod(files, 0o755)
	write := func(name string, b []byte) string {
		f := filepath.Join(files, name)
		if err := os.WriteFile(f, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	var cliCert, cliKey string
	if creds.cert != nil {
		cliCert, cliKey = write("client.crt", creds.cert), write("client.key", creds.key)
	}
	grpcTLS, clientCA := has("--grpc-tls-cert"), has("--grpc-tls-client-ca")

	// A rate limit answer, as Envoy asks it.
	ask := []string{"ask", "--addr", "127.0.0.1:8081", "--domain", "edge_proxy", "--descriptor", "remote_address=10.0.0.1"}
	if grpcTLS {
		ask = append(ask, "--tls-ca", write("ca.crt", creds.ca))
		if clientCA {
			ask = append(ask, "--tls-cert", cliCert, "--tls-key", cliKey)
		}
	}
	if out, err := p.inPod(nil, charonBin(t), ask...); err != nil || !strings.Contains(out, "OK") {
		t.Errorf("charon ask in the pod: %v: %s", err, out)
	}

	// The ports: what listens on the pod network is declared, and what is
	// declared listens (a Service or ServiceMonitor would point at nothing).
	declared := map[int]string{}
	for _, cp := range c.spec.Ports {
		declared[int(cp.ContainerPort)] = cp.Name
	}
	socks := p.listening(c)
	open := map[int]bool{}
	var loopback []int
	for _, s := range socks {
		if s.wildcard {
			open[s.port] = true
			if _, ok := declared[s.port]; !ok {
				t.Errorf("port %d is open to the pod network but not declared in the container's ports", s.port)
			}
		} else {
			loopback = append(loopback, s.port)
		}
	}
	for port, name := range declared {
		if !open[port] {
			t.Errorf("declared port %d (%s) has nothing listening on the pod network (listening: %+v)", port, name, socks)
		}
	}

	// Nothing open to the pod network serves the debug pages without
	// credentials.
	for port := range open {
		for _, scheme := range []string{"http", "https"} {
			if code, body, err := p.get(httpProbe{Scheme: scheme, Port: strconv.Itoa(port), Path: "/rlconfig"}); err == nil && code == 200 {
				t.Errorf("%s://pod:%d/rlconfig answers without credentials:\n%.200s", scheme, port, body)
			}
		}
	}

	// /metrics where the pod declares it, with the credentials the
	// ServiceMonitor would send.
	for port, name := range declared {
		if name != "metrics" && !(name == "" && port == 6070) {
			continue
		}
		pr := httpProbe{Scheme: "http", Port: strconv.Itoa(port), Path: "/metrics"}
		if !has("--metrics-addr") {
			// The debug port itself is open: with its token, or over TLS.
			if has("--debug-token-file") {
				pr.Token = creds.token
			}
			if has("--debug-tls") {
				pr.Scheme, pr.CertFile, pr.KeyFile = "https", cliCert, cliKey
			}
		}
		if code, body, err := p.get(pr); err != nil || code != 200 || !strings.Contains(body, "charon_") {
			t.Errorf("%s /metrics on port %d: %d %v %.200s", pr.Scheme, port, code, err, body)
		}
	}

	// The debug page for an operator (kubectl port-forward reaches the pod's
	// loopback).
	debug := ""
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--debug-addr="); ok {
			debug = v
		}
	}
	for i, a := range args {
		if a == "--debug-addr" && i+1 < len(args) {
			debug = args[i+1]
		}
	}
	if debug == "" {
		for _, e := range c.cmd.Env {
			if v, ok := strings.CutPrefix(e, "CHARON_DEBUG_ADDR="); ok {
				debug = v
			}
		}
	}
	if debug == "" {
		debug = "127.0.0.1:6070" // charon's default
	}
	port := debug[strings.LastIndex(debug, ":")+1:]
	pr := httpProbe{Scheme: "http", Port: port, Path: "/rlconfig"}
	if has("--debug-token-file") {
		pr.Token = creds.token
	}
	if has("--debug-tls") {
		pr.Scheme, pr.CertFile, pr.KeyFile = "https", cliCert, cliKey
	}
	if code, body, err := p.get(pr); err != nil || code != 200 || !strings.Contains(body, "domain") {
		sort.Ints(loopback)
		t.Errorf("the debug page at %s (%s): %d %v %.200s (loopback ports %v)", debug, pr.Scheme, code, err, body, loopback)
	}
}
