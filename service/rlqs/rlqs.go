// Package rlqs serves envoy.service.rate_limit_quota.v3 (RLQS): the wire
// around the quota pipeline of internal/rlqs (also named rlqs here: this
// package speaks its protobuf, the pipeline none). Each Envoy's
// rate_limit_quota filter streams its buckets' usage in and gets quota
// assignments back; the debug port's GET /rlqs shows the shares and
// charon_rlqs_* count them.
package rlqs

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/authz"
	"github.com/charonlimit/charon/internal/rlqs"
	"github.com/charonlimit/charon/server"
)

// Service serves envoy.service.rate_limit_quota.v3 with an Allocator.
// Each stream has two goroutines: the handler's, which sends the stream's
// pending actions when they are queued, and a reader, which hands the
// reports to the pipeline. Use New.
type Service struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	a       *rlqs.Allocator
	closing chan struct{}
}

// New returns the service of a; the server it registers on runs a's
// ticks while it serves.
func New(a *rlqs.Allocator) *Service {
	return &Service{a: a, closing: make(chan struct{})}
}

// Register implements server.Service: the gRPC service, a's ticks, the
// streams' end at shutdown (Envoys reconnect elsewhere), GET /rlqs on the
// debug port and the charon_rlqs_* metrics.
func (r *Service) Register(s *server.Server) error {
	rlqsv3.RegisterRateLimitQuotaServiceServer(s, r)
	s.Go(r.a.Run)
	s.OnShutdown(func() { close(r.closing) })
	s.HandleDebug(server.Endpoint{Pattern: "GET /rlqs", Name: authz.DebugRLQS, Handler: http.HandlerFunc(r.serveRLQS)})
	// A Metrics shared by several servers has the collector already.
	_ = s.Metrics().Registry.Register(rlqsCollector{r.a})
	return nil
}

// StreamRateLimitQuotas serves one Envoy. A report that cannot be used (an
// empty domain or bucket id) ends the stream with InvalidArgument; when the
// stream ends, however it ends, its shares are reclaimed once their leases
// expire.
func (r *Service) StreamRateLimitQuotas(st grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	s := r.a.Open()
	defer s.Close()
	ctx := st.Context()
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				errc <- err
				return
			}
			if err := s.Report(ctx, m.GetDomain(), usages(m)); err != nil {
				errc <- server.GRPCError(err)
				return
			}
		}
	}()
	for {
		select {
		case <-s.Notify():
			if acts := s.Pending(); len(acts) > 0 {
				if err := st.Send(quotaResponse(acts)); err != nil {
					return err
				}
			}
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-r.closing:
			return status.Error(codes.Unavailable, "charon: shutting down")
		}
	}
}

func usages(m *rlqsv3.RateLimitQuotaUsageReports) []rlqs.Usage {
	us := make([]rlqs.Usage, len(m.GetBucketQuotaUsages()))
	for i, u := range m.GetBucketQuotaUsages() {
		us[i] = rlqs.Usage{Bucket: u.GetBucketId().GetBucket(), Elapsed: u.GetTimeElapsed().AsDuration(),
			Allowed: u.GetNumRequestsAllowed(), Denied: u.GetNumRequestsDenied()}
	}
	return us
}

// quotaResponse is the wire form of actions: a token bucket of Tokens per
// Fill holding at most Burst, a blanket rule, or abandon_action.
func quotaResponse(acts []rlqs.Action) *rlqsv3.RateLimitQuotaResponse {
	resp := &rlqsv3.RateLimitQuotaResponse{BucketAction: make([]*rlqsv3.RateLimitQuotaResponse_BucketAction, len(acts))}
	for i, a := range acts {
		ba := &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: &rlqsv3.BucketId{Bucket: a.Bucket}}
		var strat *typev3.RateLimitStrategy
		switch a.Kind {
		case rlqs.Abandon:
			ba.BucketAction = &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{
				AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}
		case rlqs.Assign:
			strat = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
				MaxTokens:     uint32(min(a.Burst, 1<<32-1)),
				TokensPerFill: wrapperspb.UInt32(uint32(min(a.Tokens, 1<<32-1))),
				FillInterval:  durationpb.New(a.Fill),
			}}}
		case rlqs.Allow, rlqs.Deny:
			rule := typev3.RateLimitStrategy_ALLOW_ALL
			if a.Kind == rlqs.Deny {
				rule = typev3.RateLimitStrategy_DENY_ALL
			}
			strat = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}}
		}
		if strat != nil {
			ba.BucketAction = &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
				QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
					AssignmentTimeToLive: durationpb.New(a.TTL), RateLimitStrategy: strat}}
		}
		resp.BucketAction[i] = ba
	}
	return resp
}

// serveRLQS is the debug port's GET /rlqs: per rule, the instances, their
// demand and shares; with ?domain=D&bucket=k=v,k2=v2, how that bucket id
// resolves and its budget's shares.
func (s *Service) serveRLQS(w http.ResponseWriter, r *http.Request) {
	var v any = s.a.Stats(true)
	if q := r.URL.Query(); q.Has("bucket") || q.Has("domain") {
		es, err := descriptors.ParseDescriptor(q.Get("bucket"))
		if err != nil || q.Get("domain") == "" {
			http.Error(w, "want ?domain=D&bucket=k=v,k2=v2", http.StatusBadRequest)
			return
		}
		id := make(map[string]string, len(es))
		for _, e := range es {
			id[e.Key] = e.Value
		}
		v = s.a.Explain(q.Get("domain"), id)
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// rlqsCollector exports the pipeline's stats.
type rlqsCollector struct{ a *rlqs.Allocator }

var (
	rlqsStreamsDesc   = prometheus.NewDesc("charon_rlqs_streams", "Open RLQS streams.", nil, nil)
	rlqsInstancesDesc = prometheus.NewDesc("charon_rlqs_instances", "Streams reporting a rule's buckets (summed over its Charon domains).", []string{"rule"}, nil)
	rlqsBucketsDesc   = prometheus.NewDesc("charon_rlqs_budgets", "Budgets (Charon domains) of a rule with reporting streams.", []string{"rule"}, nil)
	rlqsLimitDesc     = prometheus.NewDesc("charon_rlqs_limit_per_second", "A rule's budgets, per second, summed over its Charon domains.", []string{"rule"}, nil)
	rlqsDemandDesc    = prometheus.NewDesc("charon_rlqs_demand_per_second", "Smoothed requests per second (allowed and denied) reported for a rule by this process' streams.", []string{"rule"}, nil)
	rlqsAssignedDesc  = prometheus.NewDesc("charon_rlqs_assigned_per_second", "Shares assigned to this process' streams, per second.", []string{"rule"}, nil)
	rlqsReportsDesc   = prometheus.NewDesc("charon_rlqs_reports_total", "Bucket usage reports received.", []string{"rule"}, nil)
	rlqsErrorsDesc    = prometheus.NewDesc("charon_rlqs_store_errors_total", "Allocations the share store failed (nothing renewed: assignments run to their TTL).", nil, nil)
)

func (c rlqsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{rlqsStreamsDesc, rlqsInstancesDesc, rlqsBucketsDesc, rlqsLimitDesc, rlqsDemandDesc, rlqsAssignedDesc, rlqsReportsDesc, rlqsErrorsDesc} {
		ch <- d
	}
}

func (c rlqsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.a.Stats(false)
	ch <- prometheus.MustNewConstMetric(rlqsStreamsDesc, prometheus.GaugeValue, float64(st.Streams))
	ch <- prometheus.MustNewConstMetric(rlqsErrorsDesc, prometheus.CounterValue, float64(st.StoreErrors))
	for _, r := range st.Rules {
		ch <- prometheus.MustNewConstMetric(rlqsInstancesDesc, prometheus.GaugeValue, float64(r.Instances), r.Rule)
		ch <- prometheus.MustNewConstMetric(rlqsBucketsDesc, prometheus.GaugeValue, float64(r.Budgets), r.Rule)
		ch <- prometheus.MustNewConstMetric(rlqsLimitDesc, prometheus.GaugeValue, r.Limit, r.Rule)
		ch <- prometheus.MustNewConstMetric(rlqsDemandDesc, prometheus.GaugeValue, r.Demand, r.Rule)
		ch <- prometheus.MustNewConstMetric(rlqsAssignedDesc, prometheus.GaugeValue, r.Assigned, r.Rule)
		ch <- prometheus.MustNewConstMetric(rlqsReportsDesc, prometheus.CounterValue, float64(r.Reports), r.Rule)
	}
}
