package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestRLQSLoad measures `charon serve`'s CPU with CHARON_RLQS_LOAD=N
// streams (10,000 for the target) reporting 10 buckets each every second,
// for 20 s: the process' user+system time from /proc over the run. It is a
// measurement, not a check, run by hand.
func TestRLQSLoad(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("CHARON_RLQS_LOAD"))
	if n <= 0 {
		t.Skip("set CHARON_RLQS_LOAD=streams to measure")
	}
	bin := buildCharon(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte("domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 100000}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startServe(t, bin, "--config", dir, "--max-concurrent-streams", "2000")
	conns := make([]*grpc.ClientConn, (n+999)/1000)
	for i := range conns {
		cc, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		conns[i] = cc
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var actions atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		st, err := rlqsv3.NewRateLimitQuotaServiceClient(conns[i%len(conns)]).StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			for {
				r, err := st.Recv()
				if err != nil {
					return
				}
				actions.Add(int64(len(r.GetBucketAction())))
			}
		}()
		go func() {
			defer wg.Done()
			us := make([]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, 10)
			elapsed := durationpb.New(0)
			// Start at a random phase within the second.
			tk := time.NewTimer(time.Duration(i%1000) * time.Millisecond)
			for {
				select {
				case <-ctx.Done():
					return
				case <-tk.C:
				}
				for k := range us {
					us[k] = &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"user": fmt.Sprint("u", k)}},
						TimeElapsed: elapsed, NumRequestsAllowed: uint64(10 + i%7)}
				}
				if st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "web", BucketQuotaUsages: us}) != nil {
					return
				}
				elapsed = durationpb.New(time.Second)
				tk.Reset(time.Second)
			}
		}()
	}
	t.Logf("%d streams open in %v", n, time.Since(start))
	time.Sleep(3 * time.Second) // settle: the measurement is of the steady state
	cpu0, t0 := procCPU(t, p.cmd.Process.Pid), time.Now()
	a0 := actions.Load()
	time.Sleep(20 * time.Second)
	cpu1, t1 := procCPU(t, p.cmd.Process.Pid), time.Now()
	a1 := actions.Load()
	t.Logf("%d streams × 10 buckets, 1 s reports: charon serve used %.2f CPU cores (%.1f s of CPU in %.1f s); %d bucket actions/s sent",
		n, (cpu1-cpu0)/t1.Sub(t0).Seconds(), cpu1-cpu0, t1.Sub(t0).Seconds(), int64(float64(a1-a0)/t1.Sub(t0).Seconds()))
	cancel()
	wg.Wait()
	p.alive(t)
}

// procCPU is a process' user+system CPU seconds from /proc.
func procCPU(t *testing.T, pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b)[strings.LastIndexByte(string(b), ')')+2:])
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}
