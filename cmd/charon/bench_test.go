package main

import (
	"strings"
	"testing"
	"time"
)

// TestBenchReserve drives reserve+release pairs, on Session streams and as
// unary calls, against an in-process server: pairs complete without errors,
// and every copy reserved is released by the end.
func TestBenchReserve(t *testing.T) {
	for _, unary := range []bool{false, true} {
		addr, copies := startCopyServer(t)
		r, err := bench(benchOptions{Addr: addr, Concurrency: 4, Conns: 1, Duration: 300 * time.Millisecond,
			Warmup: 50 * time.Millisecond, Domain: "c", Key: "db", Descriptors: 1, Keys: 1, Reserve: true, Unary: unary})
		if err != nil {
			t.Fatal(err)
		}
		if r.Requests == 0 || r.Errors != 0 {
			t.Fatalf("unary %v: requests %d errors %d (first %v), want some and none", unary, r.Requests, r.Errors, r.FirstError)
		}
		if st := copies.Stats(); st.Copies != 0 || st.Holds != 0 {
			t.Fatalf("unary %v: after the run %d copies in %d holds still held", unary, st.Copies, st.Holds)
		}
	}
}

func TestBenchFlags(t *testing.T) {
	var out, errb strings.Builder
	if err := runBench([]string{"--noop", "--reserve"}, &out, &errb); err == nil {
		t.Fatal("--noop with --reserve accepted")
	}
	if err := runBench([]string{"--unary"}, &out, &errb); err == nil {
		t.Fatal("--unary without --reserve accepted")
	}
}
