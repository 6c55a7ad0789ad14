package main

import (
	"strings"
	"testing"
)

func TestBenchFlags(t *testing.T) {
	var out, errb strings.Builder
	if err := runBench([]string{"--noop", "--reserve"}, &out, &errb); err == nil {
		t.Fatal("--noop with --reserve accepted")
	}
	if err := runBench([]string{"--unary"}, &out, &errb); err == nil {
		t.Fatal("--unary without --reserve accepted")
	}
}
