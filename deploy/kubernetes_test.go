package deploy

import (
	"bytes"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// envoyFilterCluster is the cluster the Istio EnvoyFilter sends RLS calls to.
func envoyFilterCluster(t *testing.T) string {
	t.Helper()
	b := readFile(t, "istio-envoyfilter.yaml")
	i := bytes.Index(b, []byte("cluster_name: "))
	if i < 0 {
		t.Fatal("istio-envoyfilter.yaml: no cluster_name")
	}
	line, _, _ := strings.Cut(string(b[i+len("cluster_name: "):]), "\n")
	return strings.TrimSpace(line)
}

// TestKubernetesManifests decodes base.yaml with each variant strictly and
// checks the Deployment, that the Service is the one the EnvoyFilter
// names, and that everything lives in the namespace charon.
func TestKubernetesManifests(t *testing.T) {
	for _, variant := range []string{"memory.yaml", "redis.yaml"} {
		t.Run(variant, func(t *testing.T) {
			objs := decodeObjects(t, "base.yaml", readFile(t, "kubernetes/base.yaml"))
			objs = append(objs, decodeObjects(t, variant, readFile(t, "kubernetes/"+variant))...)
			for _, o := range objs {
				if o.kind != "Namespace" && o.namespace != "charon" {
					t.Errorf("%s %s: namespace %q, want charon", o.kind, o.name, o.namespace)
				}
			}
			d, ok := find[*appsv1.Deployment](objs, "Deployment", "charon")
			svc, ok2 := find[*corev1.Service](objs, "Service", "charon")
			if !ok || !ok2 {
				t.Fatal("no Deployment or Service charon")
			}
			checkDeployment(t, variant, objs, d, svc)
			if want := "outbound|8081||charon.charon.svc.cluster.local"; envoyFilterCluster(t) != want || grpcPort(svc) != 8081 {
				t.Errorf("EnvoyFilter cluster %s, Service charon gRPC port %d; want %s and 8081", envoyFilterCluster(t), grpcPort(svc), want)
			}
			if variant == "redis.yaml" && *d.Spec.Replicas < 2 {
				t.Errorf("the Redis variant runs %d replicas", *d.Spec.Replicas)
			}
		})
	}
}

// TestDecodeIsStrict: a misspelt field is an error, not ignored.
func TestDecodeIsStrict(t *testing.T) {
	for _, doc := range []string{
		"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replicas: 1\n  template:\n    spec:\n      containers:\n        - name: c\n          securityContext: {readOnlyRootFilesytem: true}\n",
		"apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  port: 1\n",
	} {
		var head struct{ Kind string }
		_ = yaml.Unmarshal([]byte(doc), &head)
		v, _ := newObject(map[string]string{"Deployment": "apps/v1", "Service": "v1"}[head.Kind], head.Kind)
		if err := yaml.UnmarshalStrict([]byte(doc), v); err == nil {
			t.Errorf("a misspelt field was accepted:\n%s", doc)
		}
	}
}
