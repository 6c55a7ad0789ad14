package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
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
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// loadBuckets is how many buckets each stream of TestRLQSLoad reports.
const loadBuckets = 10

// loadStream is what one stream of TestRLQSLoad has received: when each of
// its buckets last got an action (Unix nanoseconds, 0: never), and the
// longest gap between two actions of one bucket in the measured window.
type loadStream struct {
	last   [loadBuckets]atomic.Int64
	maxGap atomic.Int64
}

// TestRLQSLoad measures `charon serve`'s CPU with CHARON_RLQS_LOAD=N
// streams (10,000 for the target) reporting 10 buckets each every second,
// for 20 s once every bucket has its first assignment: the server's and
// this process' (the load generator's) user+system time from /proc over the
// run, reported separately. It fails if any bucket's assignment was not
// renewed before its TTL (3 s) ran out. It is a measurement run by hand;
// CHARON_RLQS_PROFILE=file also writes the server's CPU profile of the
// measured window.
func TestRLQSLoad(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("CHARON_RLQS_LOAD"))
	if n <= 0 {
		t.Skip("set CHARON_RLQS_LOAD=streams to measure")
	}
	const ttl = 3 * time.Second // the default --rlqs-ttl
	bin := buildCharon(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte("domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 100000}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	profile := os.Getenv("CHARON_RLQS_PROFILE")
	p := startServeEnv(t, bin, []string{"GRPC_GO_LOG_SEVERITY_LEVEL=info", "GRPC_GO_LOG_VERBOSITY_LEVEL=2"}, "--config", dir, "--max-concurrent-streams", "2000", fmt.Sprintf("--pprof=%v", profile != ""))
	t.Logf("load average at the start: %s", loadAvg(t))
	conns := make([]*grpc.ClientConn, (n+999)/1000)
	for i := range conns {
		// Fixed windows: no BDP pings, which a starved server may count
		// against its keepalive policy.
		cc, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(1<<20), grpc.WithInitialConnWindowSize(16<<20))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		conns[i] = cc
	}
	// The reports are marshalled once: a stream's first (elapsed 0), then
	// the one it sends every second. The load generator sends them as they
	// are and scans the responses for their bucket ids (loadCodec), so that
	// its CPU goes to gRPC rather than to protobuf maps.
	ids := make([]*rlqsv3.BucketId, loadBuckets)
	for k := range ids {
		ids[k] = &rlqsv3.BucketId{Bucket: map[string]string{"user": fmt.Sprint("u", k)}}
	}
	reportOf := func(i int, elapsed time.Duration) *loadFrame {
		us := make([]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, loadBuckets)
		for k := range us {
			us[k] = &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: ids[k], TimeElapsed: durationpb.New(elapsed), NumRequestsAllowed: uint64(10 + i%7)}
		}
		b, err := proto.Marshal(&rlqsv3.RateLimitQuotaUsageReports{Domain: "web", BucketQuotaUsages: us})
		if err != nil {
			t.Fatal(err)
		}
		return &loadFrame{b: b}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var actions, responses atomic.Int64
	var ended atomic.Int64 // streams the server ended
	var endErr atomic.Value
	var measuring atomic.Bool
	streams := make([]*loadStream, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		st, err := conns[i%len(conns)].NewStream(ctx, &rlqsv3.RateLimitQuotaService_ServiceDesc.Streams[0],
			rlqsv3.RateLimitQuotaService_StreamRateLimitQuotas_FullMethodName, grpc.ForceCodec(loadCodec{}))
		if err != nil {
			t.Fatal(err)
		}
		ls := &loadStream{}
		streams[i] = ls
		wg.Add(2)
		go func() {
			defer wg.Done()
			var f loadFrame
			for {
				if err := st.RecvMsg(&f); err != nil {
					if ctx.Err() == nil {
						ended.Add(1)
						endErr.CompareAndSwap(nil, err.Error())
					}
					return
				}
				now := time.Now().UnixNano()
				responses.Add(1)
				n := forEachBucket(f.b, func(k int) {
					if k < 0 || k >= loadBuckets {
						return
					}
					if prev := ls.last[k].Swap(now); prev != 0 && measuring.Load() && now-prev > ls.maxGap.Load() {
						ls.maxGap.Store(now - prev)
					}
				})
				actions.Add(int64(n))
			}
		}()
		go func() {
			defer wg.Done()
			first, next := reportOf(i, 0), reportOf(i, time.Second)
			// Start at a random phase within the second.
			tk := time.NewTimer(time.Duration(i%1000) * time.Millisecond)
			defer tk.Stop()
			for m := first; ; m = next {
				select {
				case <-ctx.Done():
					return
				case <-tk.C:
				}
				if st.SendMsg(m) != nil {
					return
				}
				tk.Reset(time.Second)
			}
		}()
	}
	opened := time.Since(start)
	// Wait for every bucket's first assignment (the restart hold is a TTL).
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		missing := 0
		for _, ls := range streams {
			for k := range ls.last {
				if ls.last[k].Load() == 0 {
					missing++
				}
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d buckets never got an assignment; %d streams ended (%v); charon serve's log:\n%s",
				missing, n*loadBuckets, ended.Load(), endErr.Load(), logHead(p.stderr.String()))
		}
	}
	t.Logf("%d streams opened in %v; every bucket assigned after %v", n, opened.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	time.Sleep(3 * time.Second) // settle: the measurement is of the steady state
	measuring.Store(true)
	const window = 20 * time.Second
	var prof []byte
	profDone := make(chan error, 1)
	if profile != "" {
		go func() {
			resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.debugAddr, int(window/time.Second)))
			if err == nil {
				prof, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			profDone <- err
		}()
	}
	srv0, cli0, t0 := procCPU(t, p.cmd.Process.Pid), procCPU(t, os.Getpid()), time.Now()
	a0, r0 := actions.Load(), responses.Load()
	time.Sleep(window)
	srv1, cli1, t1 := procCPU(t, p.cmd.Process.Pid), procCPU(t, os.Getpid()), time.Now()
	a1, r1 := actions.Load(), responses.Load()
	measuring.Store(false)
	secs := t1.Sub(t0).Seconds()
	t.Logf("%d streams × %d buckets, 1 s reports, over %.1f s: charon serve used %.2f cores (%.1f s of CPU), the load generator %.2f cores (%.1f s); %d bucket actions/s in %d responses/s; load average at the end: %s",
		n, loadBuckets, secs, (srv1-srv0)/secs, srv1-srv0, (cli1-cli0)/secs, cli1-cli0, int64(float64(a1-a0)/secs), int64(float64(r1-r0)/secs), loadAvg(t))
	// Every bucket renewed before its TTL: no gap in the window as long as
	// a TTL, and none running at its end.
	var worst time.Duration
	late := 0
	end := time.Now().UnixNano()
	for _, ls := range streams {
		gap := time.Duration(ls.maxGap.Load())
		for k := range ls.last {
			gap = max(gap, time.Duration(end-ls.last[k].Load()))
		}
		worst = max(worst, gap)
		if gap >= ttl {
			late++
		}
	}
	t.Logf("longest time between two assignments of one bucket: %v", worst.Round(time.Millisecond))
	if n := ended.Load(); n > 0 {
		t.Errorf("%d streams ended: %v; charon serve's log:\n%s", n, endErr.Load(), logHead(p.stderr.String()))
	}
	if late > 0 {
		t.Errorf("%d of %d streams had a bucket whose assignment was not renewed within its TTL (%v); the longest gap %v", late, n, ttl, worst)
	}
	if profile != "" {
		if err := <-profDone; err != nil {
			t.Errorf("profile: %v", err)
		} else if err := os.WriteFile(profile, prof, 0o644); err != nil {
			t.Error(err)
		}
	}
	cancel()
	wg.Wait()
	p.alive(t)
}

// loadFrame is a message as bytes on the wire.
type loadFrame struct{ b []byte }

// loadCodec passes loadFrames through: the load generator's reports are
// marshalled once, and its responses scanned by forEachBucket.
type loadCodec struct{}

func (loadCodec) Marshal(v any) ([]byte, error) { return v.(*loadFrame).b, nil }
func (loadCodec) Unmarshal(data []byte, v any) error {
	f := v.(*loadFrame)
	f.b = append(f.b[:0], data...)
	return nil
}
func (loadCodec) Name() string { return "proto" }

// forEachBucket calls fn with K for each bucket action of a marshalled
// RateLimitQuotaResponse whose bucket id is {user: uK}, and returns how many
// bucket actions it holds: field 1 (bucket_action), its field 1
// (bucket_id), its field 1 (a bucket map entry), its field 2 (the value).
func forEachBucket(b []byte, fn func(k int)) (n int) {
	for action := range protoFields(b, 1) {
		n++
		for id := range protoFields(action, 1) {
			for entry := range protoFields(id, 1) {
				for v := range protoFields(entry, 2) {
					if k, err := strconv.Atoi(strings.TrimPrefix(string(v), "u")); err == nil {
						fn(k)
					}
				}
			}
		}
	}
	return n
}

// protoFields yields the length-delimited fields numbered num of a message.
func protoFields(b []byte, num protowire.Number) func(yield func([]byte) bool) {
	return func(yield func([]byte) bool) {
		for len(b) > 0 {
			n, typ, l := protowire.ConsumeTag(b)
			if l < 0 {
				return
			}
			b = b[l:]
			if l = protowire.ConsumeFieldValue(n, typ, b); l < 0 {
				return
			}
			field := b[:l]
			b = b[l:]
			if n != num || typ != protowire.BytesType {
				continue
			}
			v, _ := protowire.ConsumeBytes(field)
			if !yield(v) {
				return
			}
		}
	}
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

// logHead is the start of a log, without the repeats of gRPC's complaint
// about each stream of a closed connection.
func logHead(log string) string {
	var b strings.Builder
	for line := range strings.Lines(log) {
		if !strings.Contains(line, "failed to write status") && b.Len() < 4000 {
			b.WriteString(line)
		}
	}
	return b.String()
}

// loadAvg is the machine's 1, 5 and 15 minute load averages.
func loadAvg(t *testing.T) string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// TestLoadScan: the load generator's scan of a response finds every bucket
// action and the buckets {user: uK} among them.
func TestLoadScan(t *testing.T) {
	action := func(bucket map[string]string, abandon bool) *rlqsv3.RateLimitQuotaResponse_BucketAction {
		a := &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: &rlqsv3.BucketId{Bucket: bucket}}
		if abandon {
			a.BucketAction = &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}
		} else {
			a.BucketAction = &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(3 * time.Second)}}
		}
		return a
	}
	b, err := proto.Marshal(&rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{
		action(map[string]string{"user": "u3"}, false), action(map[string]string{"api": "x"}, false), action(map[string]string{"user": "u7"}, true)}})
	if err != nil {
		t.Fatal(err)
	}
	var ks []int
	if n := forEachBucket(b, func(k int) { ks = append(ks, k) }); n != 3 || fmt.Sprint(ks) != "[3 7]" {
		t.Errorf("forEachBucket: %d actions, buckets %v; want 3, [3 7]", n, ks)
	}
}
