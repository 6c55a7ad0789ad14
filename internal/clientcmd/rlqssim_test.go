package clientcmd

import (
	"context"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/rlqs"
	"github.com/charonlimit/charon/internal/sharestore"
	"github.com/charonlimit/charon/server"
	rlqsservice "github.com/charonlimit/charon/service/rlqs"
)

// rlqsServer serves RLQS for `api: search` at 100 per second, and returns
// its gRPC and debug addresses.
func rlqsServer(t *testing.T) (grpcAddr, debugAddr string) {
	t.Helper()
	cfg, _, err := config.Load(fstest.MapFS{"web.yaml": {Data: []byte(
		"domain: web\ndescriptors:\n  - key: api\n    value: search\n    rate_limit: {unit: second, requests_per_unit: 100}\n")}}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(engine.Options{})
	eng.SetTree(cfg.Tree)
	a, err := rlqs.New(rlqs.Options{Store: &sharestore.Memory{}, Tree: eng.Tree})
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.New(server.Options{GRPCAddr: "127.0.0.1:0", DebugAddr: "127.0.0.1:0", Engine: eng}, rlqsservice.New(a))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return s.GRPCAddr(), s.DebugAddr()
}

// TestRLQSSimLimit: rlqs-sim measures against the server's limit, read
// from its debug port; a --limit that differs from it is refused before
// anything runs, one that agrees is accepted; with the debug port out of
// reach, --limit is used, and said to be unchecked.
func TestRLQSSimLimit(t *testing.T) {
	grpcAddr, debugAddr := rlqsServer(t)
	for _, tc := range []struct {
		name      string
		args      []string
		code      int
		out, errs string
	}{
		{"--limit differs", []string{"--limit", "1000"}, 2, "", "--limit 1000 differs from the server's limit for web api=search, 100 per second (rule web/api=search)"},
		{"read from the server", nil, 0, "allowed", ""},
		{"--limit agrees", []string{"--limit", "100"}, 0, "of the limit 100 ", ""},
		{"debug port out of reach", []string{"--limit", "100", "--debug-addr", "127.0.0.1:1"}, 0, "of the limit 100 ", "the summary uses --limit 100 unchecked"},
		{"no rule limits the bucket", []string{"--limit", "100", "--bucket", "api=other"}, 2, "", "--limit 100: the server limits no rule for web api=other (it answers ALLOW_ALL)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"rlqs-sim", "--addr", grpcAddr, "--debug-addr", debugAddr, "--domain", "web", "--bucket", "api=search",
				"--envoys", "3", "--rate", "10", "--skew", "2", "--duration", "1s", "--interval", "1s"}, tc.args...)
			var out, errs strings.Builder
			if code := run(args, nil, &out, &errs); code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.code, out.String(), errs.String())
			}
			if !strings.Contains(out.String(), tc.out) || !strings.Contains(errs.String(), tc.errs) {
				t.Errorf("stdout %q, stderr %q: want %q and %q", out.String(), errs.String(), tc.out, tc.errs)
			}
			if tc.code == 0 && tc.args == nil && !strings.Contains(out.String(), "of the limit 100 ") {
				t.Errorf("stdout %q: want the summary against the server's limit, 100", out.String())
			}
		})
	}
}
