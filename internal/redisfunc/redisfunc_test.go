package redisfunc_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/redisfunc"
	"github.com/charonlimit/charon/internal/redistest"
)

const code = "#!lua name=rftest_@V@\n" +
	"redis.register_function('rftest_@V@', function(keys, args) return 'v' .. args[1] end)\n"

func TestNew(t *testing.T) {
	l := redisfunc.New(code)
	if len(l.Version) != 16 || l.Version != redisfunc.Hash(code) {
		t.Fatalf("Version = %q, want the 16 hex digits of Hash", l.Version)
	}
	if want := "rftest_" + l.Version; l.Name != want || l.Function("rftest_") != want {
		t.Errorf("Name = %q, Function = %q; want %q", l.Name, l.Function("rftest_"), want)
	}
	if strings.Contains(l.Code, redisfunc.Placeholder) {
		t.Errorf("Code keeps a placeholder:\n%s", l.Code)
	}
	if other := redisfunc.New(code + "-- changed\n"); other.Version == l.Version {
		t.Error("two codes, one version")
	}
}

func TestIsNotFound(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("ERR Function not found"), true},
		{errors.New("ERR unknown command"), false},
	} {
		if got := redisfunc.IsNotFound(tt.err); got != tt.want {
			t.Errorf("IsNotFound(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// fcall calls the test function through Run and counts the calls.
func fcall(t *testing.T, l *redisfunc.Library, c redis.UniversalClient, calls *int) string {
	t.Helper()
	ctx := context.Background()
	var v string
	err := l.Run(ctx, c, func() (err error) {
		*calls++
		v, err = c.FCall(ctx, l.Function("rftest_"), nil, "x").Text()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestRunLoadsWhenMissing: a call Redis answers "Function not found" is sent
// again once the library is loaded; a call that finds it is sent once.
func TestRunLoadsWhenMissing(t *testing.T) {
	n := redistest.Single(t)
	c := redistest.Client(t, n)
	l := redisfunc.New(code)
	calls := 0
	if v := fcall(t, l, c, &calls); v != "vx" || calls != 2 {
		t.Fatalf("first call: %q after %d calls, want vx after 2 (a load between)", v, calls)
	}
	calls = 0
	if v := fcall(t, l, c, &calls); v != "vx" || calls != 1 {
		t.Fatalf("loaded: %q after %d calls, want vx after 1", v, calls)
	}
	if err := c.FunctionFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	calls = 0
	if v := fcall(t, l, c, &calls); v != "vx" || calls != 2 {
		t.Fatalf("after FUNCTION FLUSH: %q after %d calls, want vx after 2", v, calls)
	}
	// Other errors are the call's own: no load, no second call.
	calls = 0
	boom := errors.New("boom")
	if err := l.Run(context.Background(), c, func() error { calls++; return boom }); err != boom || calls != 1 {
		t.Errorf("failing call: %v after %d calls, want boom after 1", err, calls)
	}
}

// TestReadyOnEveryMaster: Ready and Load reach every master of a Cluster.
func TestReadyOnEveryMaster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	nodes := redistest.Cluster(t, 3)
	c := redistest.ClusterClient(t, nodes)
	ctx := context.Background()
	l := redisfunc.New(code)
	loaded := func() int {
		n := 0
		for _, node := range nodes {
			nc := redis.NewClient(&redis.Options{Addr: node.Addr()})
			libs, err := nc.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: l.Name}).Result()
			nc.Close()
			if err != nil {
				t.Fatal(err)
			}
			n += len(libs)
		}
		return n
	}
	if err := l.Ready(ctx, c); err != nil {
		t.Fatal(err)
	}
	if n := loaded(); n != len(nodes) {
		t.Fatalf("after Ready: library on %d of %d masters", n, len(nodes))
	}
	if err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return m.FunctionFlush(ctx).Err() }); err != nil {
		t.Fatal(err)
	}
	if err := l.Load(ctx, c); err != nil {
		t.Fatal(err)
	}
	if n := loaded(); n != len(nodes) {
		t.Fatalf("after Load: library on %d of %d masters", n, len(nodes))
	}
}
