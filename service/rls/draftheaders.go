package rls

import (
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/charonlimit/charon/internal/engine"
)

// The fields of the IETF draft "RateLimit header fields for HTTP"
// (draft-ietf-httpapi-ratelimit-headers-09 and -10): RateLimit-Policy lists
// the quota policies that apply to the request, RateLimit the service
// limit left in each, both as Structured Field lists (RFC 9651) of a
// policy's name with parameters.
const (
	HeaderDraftPolicy = "RateLimit-Policy"
	HeaderDraftLimit  = "RateLimit"
)

// draftHeaders renders RateLimit-Policy and RateLimit for the limited
// statuses of an answer, one policy per rule (named by the rule's name,
// else its resource; of two statuses under one name the one with less
// left): in RateLimit-Policy its quota q (the limit in force) and window w
// in seconds, in RateLimit what remains r and the seconds until it grows,
// t, rounded up. Nothing when no status is limited.
func draftHeaders(sts []engine.Status) []*corev3.HeaderValue {
	type policy struct {
		name string
		st   *engine.Status
	}
	var ps []policy
	for i := range sts {
		st := &sts[i]
		if st.Limit == nil || st.Limit.RequestsPerUnit == 0 {
			continue
		}
		name := st.Match.Resource
		if l := st.Match.Limit; l != nil && l.Name != "" {
			name = l.Name
		}
		name = sfString(name)
		j := 0
		for j < len(ps) && ps[j].name != name {
			j++
		}
		switch {
		case j == len(ps):
			ps = append(ps, policy{name, st})
		case st.Remaining < ps[j].st.Remaining:
			ps[j].st = st
		}
	}
	if len(ps) == 0 {
		return nil
	}
	var pol, lim strings.Builder
	for i, p := range ps {
		if i > 0 {
			pol.WriteString(", ")
			lim.WriteString(", ")
		}
		l := p.st.Limit
		w := l.Unit.Length() * time.Duration(max(l.Multiplier, 1))
		pol.WriteString(p.name + ";q=" + strconv.FormatUint(uint64(l.RequestsPerUnit), 10) + ";w=" + strconv.FormatInt(int64(w/time.Second), 10))
		lim.WriteString(p.name + ";r=" + strconv.FormatUint(uint64(p.st.Remaining), 10) + ";t=" + strconv.FormatInt(ceilSeconds(p.st.ResetAfter), 10))
	}
	return []*corev3.HeaderValue{{Key: HeaderDraftPolicy, Value: pol.String()}, {Key: HeaderDraftLimit, Value: lim.String()}}
}

// ceilSeconds is d in whole seconds, rounded up, at most the largest
// Structured Field integer.
func ceilSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return min(s, 999_999_999_999_999)
}

// sfString is s as a Structured Field string: bounded, every byte outside
// printable ASCII as %XX (attributionText: names come from configuration,
// resources may hold request values), quoted, `"` and `\` escaped.
func sfString(s string) string {
	s = attributionText(s)
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}
