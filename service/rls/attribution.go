package rls

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/offenders"
	"github.com/charonlimit/charon/tiers"
)

// Attribution says which answers name the rule that decided them.
type Attribution uint8

// Attribution modes. The zero value, AttributionOff, adds nothing.
const (
	AttributionOff Attribution = iota
	// AttributionLimited attributes the answers with a status over its
	// limit (answered OVER_LIMIT, or OK by shadow mode).
	AttributionLimited
	// AttributionAll attributes every answer with a limited status.
	AttributionAll
)

// ParseAttribution reads off, limited or all.
func ParseAttribution(s string) (Attribution, error) {
	switch s {
	case "off":
		return AttributionOff, nil
	case "limited":
		return AttributionLimited, nil
	case "all":
		return AttributionAll, nil
	}
	return 0, fmt.Errorf("%q: want off, limited or all", s)
}

// AttributionKey is the field of the response's dynamic_metadata that holds
// the attribution, beside envoyproxy/ratelimit's own fields: Envoy's access
// log reads it as %DYNAMIC_METADATA(envoy.filters.http.ratelimit:charon)%.
const AttributionKey = "charon"

// maxAttributionText bounds each text of an attribution (rule, name,
// resource): a longer one is written as its stand-in (offenders.StandIn).
const maxAttributionText = 256

// Attribution header names (with AttributionHeaders).
const (
	HeaderRule       = "X-Charon-Rule"
	HeaderRuleName   = "X-Charon-Rule-Name"
	HeaderResource   = "X-Charon-Resource"
	HeaderTier       = "X-Charon-Tier"
	HeaderRetryAfter = "X-Charon-Retry-After"
)

// attributed returns the status an answer is attributed to, or -1 when the
// answer is not attributed under mode.
func attributed(mode Attribution, sts []engine.Status) int {
	if mode == AttributionOff {
		return -1
	}
	best := decidingStatus(sts)
	if best < 0 || mode == AttributionAll {
		return best
	}
	if st := &sts[best]; st.Code == engine.CodeOverLimit || st.Shadow {
		return best
	}
	// A shadow status is attributed even when another status decided the
	// headers (the one with the least remaining).
	for i := range sts {
		if sts[i].Shadow && sts[i].Limit != nil {
			return i
		}
	}
	return -1
}

// attributionText writes s's bytes that are not printable ASCII as %XX, so
// that it is valid in a protobuf string and in a header, and bounds the
// result (offenders.StandIn). A resource is written as package descriptors
// escapes it already: it is left as it is.
func attributionText(s string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f {
			clean = false
			break
		}
	}
	if !clean {
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			if c := s[i]; c < 0x20 || c >= 0x7f {
				fmt.Fprintf(&b, "%%%02X", c)
			} else {
				b.WriteByte(c)
			}
		}
		s = b.String()
	}
	return offenders.StandIn(s, maxAttributionText)
}

// attribution is the attribution of status i of resp: the rule where it is
// written (file:line), its name, the resource, the outcome, the tier in
// force, what limited it, and the retry time. It holds no request value
// beyond the resource (the configured keys and fixed values, escaped and
// bounded by package descriptors), so its size is bounded: about 1 KiB.
func attribution(resp *engine.Response, i int) *structpb.Struct {
	st := &resp.Statuses[i]
	f := map[string]*structpb.Value{
		"descriptor": structpb.NewNumberValue(float64(i)),
		"code":       structpb.NewStringValue(protoCode(st.Code).String()),
	}
	if l := st.Match.Limit; l != nil {
		if w := offenders.Where(l); w != "" {
			f["rule"] = structpb.NewStringValue(attributionText(w))
		}
		if l.Name != "" {
			f["name"] = structpb.NewStringValue(attributionText(l.Name))
		}
	}
	if st.Match.Resource != "" {
		f["resource"] = structpb.NewStringValue(attributionText(st.Match.Resource))
	}
	d := &st.Decision
	if d.Tier > 0 {
		f["tier"] = structpb.NewNumberValue(float64(d.Tier))
	}
	if l := st.Limit; l != nil {
		unit := strings.ToLower(responseUnit(l.Unit).String())
		if l.Multiplier > 1 {
			unit = strconv.FormatUint(uint64(l.Multiplier), 10) + " " + unit
		}
		f["limit"] = structpb.NewStringValue(strconv.FormatUint(uint64(l.RequestsPerUnit), 10) + " per " + unit)
	}
	if st.Shadow {
		f["shadow"] = structpb.NewBoolValue(true)
	}
	if !st.PeriodEnd.IsZero() {
		f["by"] = structpb.NewStringValue(string(st.By))
		f["quota_period_end"] = structpb.NewStringValue(st.PeriodEnd.UTC().Format(time.RFC3339Nano))
	}
	if st.Code == engine.CodeOverLimit || st.Shadow {
		f["limited_by"] = structpb.NewStringValue(d.Limiter())
		if st.By == engine.ByQuota {
			f["limited_by"] = structpb.NewStringValue("quota")
		}
		switch {
		case d.RetryAfter == tiers.Unbounded:
			f["retry_never"] = structpb.NewBoolValue(true)
		default:
			f["retry_after"] = structpb.NewNumberValue(retrySeconds(st))
		}
	}
	return &structpb.Struct{Fields: f}
}

// retrySeconds is a rejected status's retry time in seconds, to the
// millisecond, rounded up.
func retrySeconds(st *engine.Status) float64 {
	r := st.Decision.RetryAfter
	if r <= 0 {
		r = st.ResetAfter
	}
	ms := (r + time.Millisecond - 1) / time.Millisecond
	return float64(ms) / 1000
}

// attributionHeaders are status i's attribution as response headers.
func attributionHeaders(resp *engine.Response, i int) []*corev3.HeaderValue {
	st := &resp.Statuses[i]
	var hs []*corev3.HeaderValue
	add := func(k, v string) { hs = append(hs, &corev3.HeaderValue{Key: k, Value: v}) }
	if l := st.Match.Limit; l != nil {
		if w := offenders.Where(l); w != "" {
			add(HeaderRule, attributionText(w))
		}
		if l.Name != "" {
			add(HeaderRuleName, attributionText(l.Name))
		}
	}
	if st.Match.Resource != "" {
		add(HeaderResource, attributionText(st.Match.Resource))
	}
	if t := st.Decision.Tier; t > 0 {
		add(HeaderTier, strconv.Itoa(t))
	}
	if st.Code == engine.CodeOverLimit || st.Shadow {
		if st.Decision.RetryAfter == tiers.Unbounded {
			add(HeaderRetryAfter, "never")
		} else {
			add(HeaderRetryAfter, strconv.FormatFloat(retrySeconds(st), 'f', -1, 64))
		}
	}
	return hs
}
