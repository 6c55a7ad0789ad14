package clientcmd

import (
	"strings"
	"testing"
)

func TestBenchFlags(t *testing.T) {
	var out, errb strings.Builder
	if err := Bench([]string{"--noop", "--reserve"}, &out, &errb); err == nil {
		t.Fatal("--noop with --reserve accepted")
	}
	if err := Bench([]string{"--unary"}, &out, &errb); err == nil {
		t.Fatal("--unary without --reserve accepted")
	}
}
