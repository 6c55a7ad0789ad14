package redistest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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

// TestPauseWrites: a write sent while the node is paused is held (a
// blocked client of CLIENT LIST) while reads are answered, and applied once
// the node resumes.
func TestPauseWrites(t *testing.T) {
	n := Single(t)
	c := Client(t, n)
	resume := n.PauseWrites(t)
	done := make(chan error, 1)
	go func() { done <- c.Set(context.Background(), "k", "v", 0).Err() }()
	held := func() bool {
		out, err := CLI(n.Port, "client", "list")
		return err == nil && strings.Contains(out, "flags=b") && strings.Contains(out, "cmd=set")
	}
	if !poll(10*time.Second, 10*time.Millisecond, held) {
		t.Fatal("the write is not held by the pause")
	}
	if err := c.Get(context.Background(), "other").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("a read while paused: %v, want it answered (no key)", err)
	}
	select {
	case err := <-done:
		t.Fatalf("the write was answered while paused: %v", err)
	default:
	}
	resume()
	if err := <-done; err != nil {
		t.Fatalf("the held write after the pause: %v", err)
	}
	if v := c.Get(context.Background(), "k").Val(); v != "v" {
		t.Fatalf("got %q after the pause, want the held write's v", v)
	}
}
