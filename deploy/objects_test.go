package deploy

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/authz"
	"github.com/charonlimit/charon/internal/store/memstore"
)

// object is one decoded Kubernetes object.
type object struct {
	kind, name, namespace string
	value                 any // *appsv1.Deployment, *corev1.Service, ...
}

// kinds makes the typed value of each apiVersion and kind the manifests
// may hold.
var kinds = map[string]func() any{
	"v1 Namespace":                  func() any { return &corev1.Namespace{} },
	"v1 ConfigMap":                  func() any { return &corev1.ConfigMap{} },
	"v1 Secret":                     func() any { return &corev1.Secret{} },
	"v1 Service":                    func() any { return &corev1.Service{} },
	"apps/v1 Deployment":            func() any { return &appsv1.Deployment{} },
	"policy/v1 PodDisruptionBudget": func() any { return &policyv1.PodDisruptionBudget{} },
	"monitoring.coreos.com/v1 ServiceMonitor": func() any { return &monitoringv1.ServiceMonitor{} },
	"monitoring.coreos.com/v1 PrometheusRule": func() any { return &monitoringv1.PrometheusRule{} },
}

// newObject returns the typed value of an apiVersion and kind.
func newObject(apiVersion, kind string) (any, error) {
	if k := kinds[apiVersion+" "+kind]; k != nil {
		return k(), nil
	}
	return nil, fmt.Errorf("unexpected %s %s", apiVersion, kind)
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// decodeObjects decodes every YAML document of b strictly (an unknown or
// misspelt field is an error) into its k8s.io/api type.
func decodeObjects(t *testing.T, name string, b []byte) []object {
	t.Helper()
	var objs []object
	for i, doc := range docSep.Split(string(b), -1) {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("%s: document %d: %v", name, i, err)
		}
		if head.Kind == "" {
			continue // comments only
		}
		v, err := newObject(head.APIVersion, head.Kind)
		if err != nil {
			t.Errorf("%s: document %d: %v", name, i, err)
			continue
		}
		if err := yaml.UnmarshalStrict([]byte(doc), v); err != nil {
			t.Errorf("%s: %s %s: %v", name, head.Kind, head.Metadata.Name, err)
			continue
		}
		objs = append(objs, object{head.Kind, head.Metadata.Name, head.Metadata.Namespace, v})
	}
	return objs
}

func find[T any](objs []object, kind, name string) (T, bool) {
	for _, o := range objs {
		if o.kind == kind && o.name == name {
			return o.value.(T), true
		}
	}
	var zero T
	return zero, false
}

// checkDeployment checks what every Charon Deployment must have: probes
// on the gRPC health service or HTTP health check, resources, a locked-down
// security context, arguments `charon serve` knows, a configuration
// directory that loads, an authorization table that parses, a topology
// spread with several replicas; and that svc selects its pods.
func checkDeployment(t *testing.T, name string, objs []object, d *appsv1.Deployment, svc *corev1.Service) {
	t.Helper()
	pod := d.Spec.Template
	for k, v := range d.Spec.Selector.MatchLabels {
		if pod.Labels[k] != v {
			t.Errorf("%s: the Deployment's selector %s=%s does not select its pods", name, k, v)
		}
	}
	for k, v := range svc.Spec.Selector {
		if pod.Labels[k] != v {
			t.Errorf("%s: Service %s selects %s=%s, which the pods lack", name, svc.Name, k, v)
		}
	}
	if sc := pod.Spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("%s: pod may run as root", name)
	}
	if d.Spec.Replicas != nil && *d.Spec.Replicas > 1 && len(pod.Spec.TopologySpreadConstraints) == 0 {
		t.Errorf("%s: %d replicas with no topology spread", name, *d.Spec.Replicas)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%s: %d containers, want 1", name, len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if c.ReadinessProbe == nil || c.LivenessProbe == nil {
		t.Errorf("%s: readiness or liveness probe missing", name)
	}
	for _, p := range []*corev1.Probe{c.StartupProbe, c.ReadinessProbe, c.LivenessProbe} {
		if p == nil {
			continue
		}
		switch {
		case p.GRPC != nil && p.GRPC.Port == 8081:
		case p.HTTPGet != nil && p.HTTPGet.Path == "/healthcheck":
		case p.TCPSocket != nil:
		default:
			t.Errorf("%s: a probe is neither gRPC health on 8081 nor /healthcheck: %+v", name, p.ProbeHandler)
		}
	}
	// gRPC health, and /healthcheck which follows it, turn NOT_SERVING
	// while the Redis store cannot answer in --failure-mode unavailable:
	// right for readiness, but a probe that restarts the container on it
	// would restart every pod for the length of a Redis outage.
	for _, p := range []struct {
		kind  string
		probe *corev1.Probe
	}{{"startup", c.StartupProbe}, {"liveness", c.LivenessProbe}} {
		if p.probe != nil && p.probe.TCPSocket == nil {
			t.Errorf("%s: the %s probe %+v asks the health the store drives: want tcpSocket", name, p.kind, p.probe.ProbeHandler)
		}
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("%s: resources: %+v, want CPU and memory requests and a memory limit", name, c.Resources)
	}
	checkMemory(t, name, c)
	checkSecretKeys(t, name, objs, pod.Spec)
	sc := c.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("%s: container security context %+v, want no privilege escalation, read-only root, drop ALL", name, sc)
	}
	known := charonServeFlags(t)
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Errorf("%s: args %v, want serve first", name, c.Args)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	for i, a := range c.Args[1:] {
		f, ok := strings.CutPrefix(a, "--")
		if !ok {
			continue
		}
		f, val, hasVal := strings.Cut(f, "=")
		if !slices.Contains(known, f) {
			t.Errorf("%s: charon serve has no flag --%s", name, f)
		}
		if !hasVal && i+2 < len(c.Args) && !strings.HasPrefix(c.Args[i+2], "--") {
			val = c.Args[i+2]
		}
		if strings.HasPrefix(val, "/etc/charon/") && !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return strings.HasPrefix(val, m.MountPath+"/") || val == m.MountPath
		}) {
			t.Errorf("%s: --%s %s is on no mounted volume", name, f, val)
		}
	}
	for _, e := range c.Env {
		if n, ok := strings.CutPrefix(e.Name, "CHARON_"); ok && !slices.Contains(known, strings.ReplaceAll(strings.ToLower(n), "_", "-")) && n != "REDIS_PASSWORD" {
			t.Errorf("%s: %s names no flag of charon serve", name, e.Name)
		}
	}
	for _, v := range pod.Spec.Volumes {
		if _, ok := mounts[v.Name]; !ok {
			t.Errorf("%s: volume %s is not mounted", name, v.Name)
		}
		if v.ConfigMap == nil {
			continue
		}
		cm, ok := find[*corev1.ConfigMap](objs, "ConfigMap", v.ConfigMap.Name)
		if !ok {
			t.Errorf("%s: volume %s: no ConfigMap %s", name, v.Name, v.ConfigMap.Name)
			continue
		}
		if mounts[v.Name] == "/etc/charon/config" {
			fsys := fstest.MapFS{}
			for f, body := range cm.Data {
				fsys[f] = &fstest.MapFile{Data: []byte(body)}
			}
			if _, _, err := config.Load(fsys, config.Options{}); err != nil {
				t.Errorf("%s: ConfigMap %s does not load: %v", name, cm.Name, err)
			}
		}
		if body, ok := cm.Data["authz.yaml"]; ok {
			if _, err := authz.Parse([]byte(body)); err != nil {
				t.Errorf("%s: ConfigMap %s: %v", name, cm.Name, err)
			}
		}
	}
}

// grpcPort returns the Service's port named grpc.
func grpcPort(svc *corev1.Service) int32 {
	for _, p := range svc.Spec.Ports {
		if p.Name == "grpc" {
			return p.Port
		}
	}
	return 0
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSpace(b)
}

// pairBytes bounds the heap one tracked one-tier pair costs (memstore's
// TestPairCost holds pairs to it; they measure about 390 bytes).
const pairBytes = 512

// checkMemory checks the container's GOMEMLIMIT: a value below the memory
// limit, leaving room for what is not Go heap (docs/operations.md: "Set
// GOMEMLIMIT below the container's limit"), and room under it for the
// pairs --max-keys lets the process track, at most two thirds of it.
func checkMemory(t *testing.T, name string, c corev1.Container) {
	t.Helper()
	limit := c.Resources.Limits.Memory().Value()
	var goMemLimit int64 = -1
	for _, e := range c.Env {
		if e.Name != "GOMEMLIMIT" {
			continue
		}
		if e.ValueFrom != nil {
			t.Errorf("%s: GOMEMLIMIT from %+v: the whole memory limit leaves nothing for what is not Go heap", name, e.ValueFrom)
			return
		}
		n, err := parseGoMemLimit(e.Value)
		if err != nil {
			t.Errorf("%s: GOMEMLIMIT %q: %v", name, e.Value, err)
			return
		}
		goMemLimit = n
	}
	if goMemLimit < 0 {
		t.Errorf("%s: no GOMEMLIMIT", name)
		return
	}
	if goMemLimit > limit*95/100 {
		t.Errorf("%s: GOMEMLIMIT %d bytes, want at most 95%% of limits.memory (%d bytes)", name, goMemLimit, limit)
	}
	maxKeys := int64(memstore.DefaultMaxKeys)
	if v, ok := serveSetting(c, "max-keys"); ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Errorf("%s: --max-keys %q: %v", name, v, err)
		}
		maxKeys = n
	}
	if maxKeys*pairBytes > goMemLimit*2/3 {
		t.Errorf("%s: --max-keys %d lets pairs take %d MiB of heap, more than two thirds of GOMEMLIMIT (%d MiB)",
			name, maxKeys, maxKeys*pairBytes>>20, goMemLimit>>20)
	}
}

// parseGoMemLimit reads GOMEMLIMIT as the Go runtime does: a number of
// bytes with an optional B, KiB, MiB, GiB or TiB suffix.
func parseGoMemLimit(s string) (int64, error) {
	m := regexp.MustCompile(`^([0-9]+)(B|KiB|MiB|GiB|TiB)?$`).FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("not a number of bytes with B, KiB, MiB, GiB or TiB")
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	shift := map[string]int{"": 0, "B": 0, "KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40}[m[2]]
	return n << shift, err
}

// serveSetting is the value a `charon serve` flag gets from the container's
// arguments (--flag=v or --flag v), or else from its CHARON_ variable.
func serveSetting(c corev1.Container, flag string) (string, bool) {
	for i, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--"+flag+"="); ok {
			return v, true
		}
		if a == "--"+flag && i+1 < len(c.Args) {
			return c.Args[i+1], true
		}
	}
	for _, e := range c.Env {
		if e.Name == "CHARON_"+strings.ToUpper(strings.ReplaceAll(flag, "-", "_")) && e.ValueFrom == nil {
			return e.Value, true
		}
	}
	return "", false
}

// checkSecretKeys: every key the pod takes from a Secret rendered beside it
// is one that Secret holds (the kubelet would not start the pod otherwise).
func checkSecretKeys(t *testing.T, name string, objs []object, pod corev1.PodSpec) {
	t.Helper()
	has := func(secret, key string) (found, known bool) {
		s, ok := find[*corev1.Secret](objs, "Secret", secret)
		if !ok {
			return false, false
		}
		_, inString := s.StringData[key]
		_, inData := s.Data[key]
		return inString || inData, true
	}
	for _, v := range pod.Volumes {
		if v.Secret == nil {
			continue
		}
		for _, it := range v.Secret.Items {
			if found, known := has(v.Secret.SecretName, it.Key); known && !found {
				t.Errorf("%s: volume %s mounts key %q, which Secret %s lacks", name, v.Name, it.Key, v.Secret.SecretName)
			}
		}
	}
	for _, c := range pod.Containers {
		for _, e := range c.Env {
			if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil {
				if found, known := has(r.SecretKeyRef.Name, r.SecretKeyRef.Key); known && !found {
					t.Errorf("%s: %s takes key %q, which Secret %s lacks", name, e.Name, r.SecretKeyRef.Key, r.SecretKeyRef.Name)
				}
			}
		}
	}
}
