package server

import (
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFlagsCheckNamesTheFlag: every refusal names the flag at fault, and
// the defaults pass.
func TestFlagsCheckNamesTheFlag(t *testing.T) {
	def := DefaultFlags()
	if err := def.Check(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--shutdown-timeout", "0s"}, "--shutdown-timeout"},
		{[]string{"--shutdown-delay", "-1s"}, "--shutdown-delay"},
		{[]string{"--http-read-timeout", "0s"}, "--http-read-timeout"},
		{[]string{"--max-concurrent-streams", "0"}, "--max-concurrent-streams"},
		{[]string{"--grpc-max-connection-age", "-1s"}, "--grpc-max-connection-age"},
		{[]string{"--metrics-path", "metrics"}, "--metrics-path"},
		{[]string{"--grpc-tls-cert", "c.pem"}, "--grpc-tls-key"},
		{[]string{"--http-tls"}, "--http-tls"},
		{[]string{"--debug-tls"}, "--debug-tls"},
		{[]string{"--authz", "a.yaml"}, "--authz"},
		// The default debug port (127.0.0.1:6070) is inside :6070.
		{[]string{"--metrics-addr", ":6070"}, "--debug-addr 127.0.0.1:6070 and --metrics-addr :6070 share port 6070"},
		{[]string{"--debug-addr", ":8081"}, "--grpc-addr :8081 and --debug-addr :8081"},
		{[]string{"--http-addr", "127.0.0.1:9000", "--metrics-addr", "[::]:9000"}, "share port 9000"},
	}
	for _, tc := range tests {
		f := DefaultFlags()
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		f.Bind(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if err := f.Check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one naming %s", tc.args, err, tc.want)
		}
	}
}

// TestListenersThatCoexist: what the kernel lets open together is not refused.
func TestListenersThatCoexist(t *testing.T) {
	for _, args := range [][]string{
		{"--metrics-addr", ":6071"},
		{"--debug-addr", "127.0.0.1:6071", "--metrics-addr", ":6070"},
		{"--debug-addr", "127.0.0.1:0", "--metrics-addr", ":0", "--http-addr", ":0", "--grpc-addr", ":0"},
		{"--debug-addr", "127.0.0.1:7000", "--metrics-addr", "127.0.0.2:7000"},
		{"--debug-addr", "", "--metrics-addr", "127.0.0.1:6070"},
	} {
		f := DefaultFlags()
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		f.Bind(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if err := f.Check(); err != nil {
			t.Errorf("%v refused: %v", args, err)
		}
	}
}

// TestFlagsResolveSaysWhatToDo: an empty token file and profiles open
// beyond loopback say what to do, not only what is wrong.
func TestFlagsResolveSaysWhatToDo(t *testing.T) {
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := DefaultFlags()
	f.DebugTokenFile = token
	if _, err := f.Resolve(slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "write a token into it (e.g. openssl rand -hex 32 > "+token+")") {
		t.Errorf("empty token file: %v, want how to write one", err)
	}
	var logs strings.Builder
	f = DefaultFlags()
	f.DebugAddr, f.Pprof = "0.0.0.0:6070", true
	if _, err := f.Resolve(slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "bind --debug-addr to 127.0.0.1, or set --debug-token-file or --debug-tls") {
		t.Errorf("pprof beyond loopback logged %q, want the remedy", logs.String())
	}
}
