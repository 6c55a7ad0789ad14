package redistest

import (
	"context"
	"strings"
	"testing"
)

func TestSingle(t *testing.T) {
	n := Single(t)
	out, err := CLI(n.Port, "set", "k", "v")
	if err != nil || !strings.Contains(out, "OK") {
		t.Fatalf("set: %q %v", out, err)
	}
	if v, err := Client(t, n).Get(context.Background(), "k").Result(); err != nil || v != "v" {
		t.Fatalf("get through Client: %q %v", v, err)
	}
	n.Kill()
	if ping(n.Port) {
		t.Fatal("node still answers after Kill")
	}
}

func TestCluster(t *testing.T) {
	nodes := Cluster(t, 3)
	out, err := CLI(nodes[0].Port, "cluster", "info")
	if err != nil || !strings.Contains(out, "cluster_known_nodes:3") {
		t.Fatalf("cluster info: %q %v", out, err)
	}
	if err := ClusterClient(t, nodes).Set(context.Background(), "k", "v", 0).Err(); err != nil {
		t.Fatalf("set through ClusterClient: %v", err)
	}
	if err := Reshard(nodes[0], nodes[1], 10); err != nil {
		t.Fatal(err)
	}
}

func TestSentinel(t *testing.T) {
	s := Sentinel(t)
	out, err := CLI(s.Sentinel.Port, "sentinel", "masters")
	if err != nil || !strings.Contains(out, "mymaster") {
		t.Fatalf("sentinel masters: %q %v", out, err)
	}
}
