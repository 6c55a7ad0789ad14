package rls

import (
	"flag"
	"io"
	"strings"
	"testing"
)

// TestOptionsCheckNamesTheFlag: every refusal names the flag at fault, and
// the defaults pass.
func TestOptionsCheckNamesTheFlag(t *testing.T) {
	def := DefaultOptions()
	if err := def.Check(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--near-limit-ratio", "1.5"}, "--near-limit-ratio"},
		{[]string{"--remaining-header", "a b"}, "--remaining-header"},
		{[]string{"--top-k", "-1"}, "--top-k"},
		{[]string{"--top-rules", "0"}, "--top-rules"},
		{[]string{"--top-epoch", "10ms"}, "--top-epoch"},
		{[]string{"--top-metrics", "33"}, "--top-metrics"},
		{[]string{"--top-k", "0", "--top-metrics", "1"}, "--top-metrics"},
	}
	for _, tc := range tests {
		o := DefaultOptions()
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o.Bind(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if err := o.Check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one naming %s", tc.args, err, tc.want)
		}
	}
	// --attribution is refused as it is parsed, naming what it takes.
	o := DefaultOptions()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.Bind(fs)
	if err := fs.Parse([]string{"--attribution", "some"}); err == nil || !strings.Contains(err.Error(), "-attribution") || !strings.Contains(err.Error(), "off, limited or all") {
		t.Errorf("--attribution some: %v, want a refusal naming the flag and its values", err)
	}
	for _, v := range []string{"off", "limited", "all"} {
		if err := fs.Set("attribution", v); err != nil || o.Attribution.String() != v {
			t.Errorf("--attribution %s: %v, reads back %q", v, err, o.Attribution.String())
		}
	}
}
