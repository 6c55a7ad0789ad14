package loadgen

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/charonlimit/charon/internal/servertest"
)

// TestMain fails the package's tests if any goroutine outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestReservePairs drives reserve+release pairs, on Session streams and as
// unary calls, against an in-process server: pairs complete without errors,
// and every copy reserved is released by the end.
func TestReservePairs(t *testing.T) {
	for _, unary := range []bool{false, true} {
		addr, copies := servertest.CopyServer(t)
		r, err := Run(Options{Addr: addr, Concurrency: 4, Conns: 1, Duration: 300 * time.Millisecond,
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
