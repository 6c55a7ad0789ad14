package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/charonlimit/charon/internal/redistest"
)

// escrowLimit is the limit per second of the escrow process test's key:
// at most 64, so that the store keeps exact timestamps and the limit holds
// over the whole second (above, a window is counted in 64 buckets).
const escrowLimit = 50

// grant is a granted answer: the decision was made between sent and got.
type grant struct{ sent, got time.Time }

// TestEscrowProcesses runs three `charon serve --store redis --escrow`
// replicas on one Redis, one key asked for at many times its limit through
// all three, and kills one replica (SIGKILL) halfway: from the clients'
// answers, no second holds more grants than the limit, leases or not, and
// the decisions cost Redis far fewer calls than one each (the figures are
// logged: FCALLs and share-store transactions per decision). The same run
// without --escrow is the baseline.
func TestEscrowProcesses(t *testing.T) {
	bin := buildCharon(t)
	dir := t.TempDir()
	yaml := fmt.Sprintf(`domain: test
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: %d}
`, escrowLimit)
	if err := os.WriteFile(filepath.Join(dir, "test.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"escrow", "shared"} {
		t.Run(mode, func(t *testing.T) {
			r := redistest.Single(t)
			args := []string{"--config", dir, "--store", "redis", "--redis-url", "redis://" + r.Addr(), "--redis-timeout", "2s"}
			if mode == "escrow" {
				args = append(args, "--escrow", "--escrow-lease", "50ms", "--escrow-threshold", "20", "--escrow-rebalance", "500ms")
			}
			var procs []*proc
			for range 3 {
				procs = append(procs, startServe(t, bin, args...))
			}
			before := commandStats(t, r.Port)
			grants, asked, errs := loadEscrow(t, procs, 6*time.Second, 3*time.Second)
			after := commandStats(t, r.Port)
			if over := overLimit(grants, time.Second, escrowLimit); over != "" {
				t.Errorf("%s: %s", mode, over)
			}
			fcalls := after["fcall"] - before["fcall"]
			execs := after["exec"] - before["exec"]
			var all int64
			for k, v := range after {
				all += v - before[k]
			}
			t.Logf("%s: %d requests (%.0f/s, %.1fx the limit), %d granted, %d errors (the killed replica's); Redis: %.4f FCALL and %.4f EXEC per decision, %.4f commands in all (scripts' own included)",
				mode, asked, float64(asked)/6, float64(asked)/6/escrowLimit, len(grants), errs, float64(fcalls)/float64(asked), float64(execs)/float64(asked), float64(all)/float64(asked))
			if mode == "escrow" {
				if body := procs[0].stderr.String(); strings.Contains(body, "level=ERROR") {
					t.Errorf("errors logged:\n%s", body)
				}
			}
		})
	}
}

// loadEscrow asks for tenant=acme through procs from four clients each
// for d, kills the last proc (SIGKILL) after kill, and returns the grants
// answered, the requests answered and the errors.
func loadEscrow(t *testing.T, procs []*proc, d, kill time.Duration) ([]grant, int, int) {
	t.Helper()
	var mu sync.Mutex
	var grants []grant
	asked, errs := 0, 0
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	for i, p := range procs {
		for range 4 {
			wg.Go(func() {
				for ctx.Err() == nil {
					rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
					sent := time.Now()
					resp, err := p.ask(rctx, "tenant", "acme")
					got := time.Now()
					rcancel()
					mu.Lock()
					switch {
					case err != nil:
						if ctx.Err() == nil {
							errs++
						}
					case resp.OverallCode == rlsv3.RateLimitResponse_OK:
						asked++
						grants = append(grants, grant{sent, got})
					default:
						asked++
					}
					mu.Unlock()
				}
			})
		}
		if i == len(procs)-1 {
			victim := p
			time.AfterFunc(kill, func() { victim.cmd.Process.Signal(syscall.SIGKILL) })
		}
	}
	wg.Wait()
	return grants, asked, errs
}

// overLimit returns a description of a window of w holding more than limit
// grants, or "": for each grant, the grants whose decisions certainly fell
// in the window starting when it was sent (sent at or after it, answered
// before the window's end) are counted.
func overLimit(grants []grant, w time.Duration, limit int) string {
	slices.SortFunc(grants, func(a, b grant) int { return a.sent.Compare(b.sent) })
	for i, g := range grants {
		n := 0
		for _, h := range grants[i:] {
			if h.sent.Sub(g.sent) >= w {
				break
			}
			if h.got.Sub(g.sent) < w {
				n++
			}
		}
		if n > limit {
			return fmt.Sprintf("%d grants decided within %v from %v, limit %d", n, w, g.sent.Format(time.StampMicro), limit)
		}
	}
	return ""
}

// commandStats returns the calls of each command Redis has run
// (INFO commandstats), by name.
func commandStats(t *testing.T, port int) map[string]int64 {
	t.Helper()
	out, err := redistest.CLI(port, "info", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int64{}
	for _, line := range strings.Split(out, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
		m[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return m
}
