package rls

import (
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/charonlimit/charon/internal/engine"
)

// QuotaKey is the field of an RLS answer's dynamic_metadata that tells,
// when the answer's deciding descriptor has a calendar quota, which limit
// decided it and when the quota's period ends: an Envoy access log reads it
// as %DYNAMIC_METADATA(envoy.filters.http.ratelimit:charon_quota)%.
const QuotaKey = "charon_quota"

// Calendar quota headers, added to an RLS answer whose deciding descriptor
// has a calendar quota (Envoy adds them to the client's response).
const (
	// HeaderLimitKind is "quota" when the quota decided the answer (and
	// its RateLimit-* headers), "rate" when the rate policy did.
	HeaderLimitKind = "X-Charon-Limit-Kind"
	// HeaderQuotaRemaining is the hits left in the quota's period.
	HeaderQuotaRemaining = "X-Charon-Quota-Remaining"
	// HeaderQuotaReset is the end of the quota's period (RFC 3339, UTC).
	HeaderQuotaReset = "X-Charon-Quota-Reset"
)

// quotaStatus returns the status whose calendar quota an answer reports:
// the deciding status when it has one, else the first status with a quota;
// -1 when none has.
func quotaStatus(sts []engine.Status) int {
	if i := decidingStatus(sts); i >= 0 && !sts[i].PeriodEnd.IsZero() {
		return i
	}
	for i := range sts {
		if !sts[i].PeriodEnd.IsZero() {
			return i
		}
	}
	return -1
}

// addQuota writes status i's calendar quota to out's dynamic metadata and
// headers.
func addQuota(out *rlsv3.RateLimitResponse, sts []engine.Status, i int) {
	st := &sts[i]
	q := &st.QuotaDecision
	end := st.PeriodEnd.UTC().Format(time.RFC3339Nano)
	f := map[string]*structpb.Value{
		"descriptor": structpb.NewNumberValue(float64(i)),
		"by":         structpb.NewStringValue(string(st.By)),
		"period_end": structpb.NewStringValue(end),
		"used":       structpb.NewNumberValue(float64(q.TierHits)),
		"remaining":  structpb.NewNumberValue(float64(q.Remaining)),
		"limit":      structpb.NewNumberValue(float64(q.TierLimit)),
	}
	if out.DynamicMetadata == nil {
		out.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	out.DynamicMetadata.Fields[QuotaKey] = structpb.NewStructValue(&structpb.Struct{Fields: f})
	out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd,
		&corev3.HeaderValue{Key: HeaderLimitKind, Value: string(st.By)},
		&corev3.HeaderValue{Key: HeaderQuotaRemaining, Value: strconv.FormatInt(max(q.Remaining, 0), 10)},
		&corev3.HeaderValue{Key: HeaderQuotaReset, Value: end},
	)
}

// quotaMetrics counts the hits of descriptors with a calendar quota by
// the quota's answer, and the rejections by the limit that made them.
type quotaMetrics struct {
	hits     *prometheus.CounterVec // domain, key, result (within, over)
	rejected *prometheus.CounterVec // domain, key, by (rate, quota)
}

func newQuotaMetrics(reg prometheus.Registerer) (*quotaMetrics, error) {
	q := &quotaMetrics{
		hits: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "charon", Subsystem: "quota", Name: "hits_total",
			Help: "Hits of descriptors with a calendar quota, by the quota's own answer (within, over)."}, []string{"domain", "key", "result"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "charon", Subsystem: "rate_limit", Name: "rejected_by_total",
			Help: "Hits of descriptors with a calendar quota answered OVER_LIMIT, by the limit that decided (rate, quota)."}, []string{"domain", "key", "by"}),
	}
	for _, c := range []prometheus.Collector{q.hits, q.rejected} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return q, nil
}

func (q *quotaMetrics) count(req *engine.Request, resp *engine.Response) {
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		if st.PeriodEnd.IsZero() || st.Match.MetricKey == "" || i >= len(req.Descriptors) || req.Descriptors[i].Refund {
			continue
		}
		hits := float64(descriptorHits(req, i))
		result := "within"
		if !st.QuotaDecision.OK {
			result = "over"
		}
		q.hits.WithLabelValues(req.Domain, st.Match.MetricKey, result).Add(hits)
		if st.Code == engine.CodeOverLimit {
			q.rejected.WithLabelValues(req.Domain, st.Match.MetricKey, string(st.By)).Add(hits)
		}
	}
}
