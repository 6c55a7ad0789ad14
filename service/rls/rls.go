// Package rls serves Envoy's RateLimitService v3 (envoy.service.ratelimit.v3)
// over gRPC and envoyproxy/ratelimit's /json on the HTTP port: a request
// converted to the engine's (internal/engine), decided, and its answer
// converted back with the response headers, shadow mode, dynamic
// metadata, attribution and calendar quota envoyproxy/ratelimit's users
// expect. After the answer is built, observers are told of the decision
// (observe.go): the descriptor metrics (Charon's names and
// envoyproxy/ratelimit's, metrics.go and lyftmetrics.go), the decision
// log, the top offenders (served at /top and /ui/ on the debug port) and
// the candidate configuration, the one slow observer, off the request
// path. The service registers itself on the server it is handed
// (Service.Register).
package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/offenders"
	"github.com/charonlimit/charon/server"
	"github.com/charonlimit/charon/tiers"
)

// Decider is what the service needs from the decision pipeline;
// *engine.Engine implements it. Implementations must be safe for
// concurrent use.
type Decider interface {
	ShouldRateLimit(ctx context.Context, req *engine.Request) (*engine.Response, error)
}

// errNoResponse is an engine that answered neither a response nor an error.
var errNoResponse = errors.New("rls: engine returned no response")

// Service implements envoy.service.ratelimit.v3.RateLimitService. Use New,
// and serve it with a server (Register).
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	engine          Decider
	opts            Options
	metrics         *metrics
	log             *slog.Logger
	responseHeaders bool
	headerNames     [3]string
	draftHeaders    bool
	shadowMode      bool
	dynamicMetadata bool
	// observers are told of each decided request once its answer is built
	// (observe.go).
	observers []Observer
	// srv is the server it is registered on: its Ready error (while the
	// server waits for a first configuration) answers requests (nil:
	// ready).
	srv *server.Server
	// attribution and attributionHeaders say which answers name their rule,
	// in dynamic metadata and in headers.
	attribution        Attribution
	attributionHeaders bool
	// top tracks who is limited (nil: --top-k 0); candidate runs
	// Options.Candidate's observations off the request path (nil: no
	// candidate).
	top       *offenders.Tracker
	candidate *background
}

// defaultHeaderNames are the response headers' names, as in
// envoyproxy/ratelimit.
var defaultHeaderNames = [3]string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"}

// ShouldRateLimit decides one Envoy request.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	resp, err := s.decide(ctx, req)
	s.metrics.observeRequest(time.Since(start), err)
	return resp, err
}

func (s *Service) decide(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if s.srv != nil {
		if err := s.srv.Ready(); err != nil {
			return nil, s.fail(req, err)
		}
	}
	ereq, err := toEngineRequest(req)
	if err != nil {
		return nil, s.fail(req, err)
	}
	eresp, err := s.engine.ShouldRateLimit(ctx, ereq)
	if err == nil && eresp == nil {
		err = errNoResponse
	}
	if err != nil {
		return nil, s.fail(req, err)
	}
	out := toProtoResponse(eresp, s.responseHeaders, s.headerNames)
	if s.shadowMode && out.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		out.OverallCode = rlsv3.RateLimitResponse_OK
		s.metrics.globalShadowed()
	}
	if s.dynamicMetadata {
		out.DynamicMetadata = dynamicMetadata(req, eresp)
	}
	if i := attributed(s.attribution, eresp.Statuses); i >= 0 {
		if out.DynamicMetadata == nil {
			out.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{}}
		}
		out.DynamicMetadata.Fields[AttributionKey] = structpb.NewStructValue(attribution(eresp, i))
		if s.attributionHeaders {
			out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd, attributionHeaders(eresp, i)...)
		}
	}
	if eresp.Slots > 0 {
		addSlots(out, eresp)
	}
	if i := quotaStatus(eresp.Statuses); i >= 0 {
		addQuota(out, eresp.Statuses, i)
	}
	if s.draftHeaders {
		out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd, draftHeaders(eresp.Statuses)...)
	}
	// The answer is built: nothing an observer does can change or delay
	// it beyond its own call (a slow one runs in the background).
	for _, o := range s.observers {
		o.Observe(ctx, ereq, eresp)
	}
	return out, nil
}

// fail logs err with truncated request values and maps it to gRPC. Bad
// input and UNAVAILABLE (the store's failure mode while Redis is down,
// logged once when the breaker opens and counted per request) are logged
// at debug level, so an outage does not write a line per request.
func (s *Service) fail(req *rlsv3.RateLimitRequest, err error) error {
	gerr := server.GRPCError(err)
	code := status.Code(gerr)
	switch code {
	case codes.InvalidArgument:
		s.log.Debug("invalid request", "domain", descriptors.Truncate(req.GetDomain()), "descriptors", len(req.GetDescriptors()), "err", descriptors.Truncate(err.Error()))
	case codes.Unavailable:
		s.log.Debug("request failed", "domain", descriptors.Truncate(req.GetDomain()), "code", code.String(), "err", descriptors.Truncate(err.Error()))
	default:
		s.log.Warn("request failed", "domain", descriptors.Truncate(req.GetDomain()), "code", code.String(), "err", descriptors.Truncate(err.Error()))
	}
	return gerr
}

// overrideUnits maps Envoy's request-side envoy.type.v3.RateLimitUnit (which
// has no WEEK) to tiers units.
var overrideUnits = map[typev3.RateLimitUnit]tiers.Unit{
	typev3.RateLimitUnit_SECOND: tiers.UnitSecond,
	typev3.RateLimitUnit_MINUTE: tiers.UnitMinute,
	typev3.RateLimitUnit_HOUR:   tiers.UnitHour,
	typev3.RateLimitUnit_DAY:    tiers.UnitDay,
	typev3.RateLimitUnit_MONTH:  tiers.UnitMonth,
	typev3.RateLimitUnit_YEAR:   tiers.UnitYear,
}

// toEngineRequest converts an Envoy request. It rejects only what the engine
// cannot express (an override unit it does not know); every other check
// belongs to the engine.
func toEngineRequest(req *rlsv3.RateLimitRequest) (*engine.Request, error) {
	pds := req.GetDescriptors()
	out := &engine.Request{
		Domain:      req.GetDomain(),
		Hits:        req.GetHitsAddend(),
		Descriptors: make([]engine.Descriptor, len(pds)),
	}
	nEntries := 0
	for _, d := range pds {
		nEntries += len(d.GetEntries())
	}
	entries := make([]descriptors.Entry, nEntries)
	for i, d := range pds {
		ed := &out.Descriptors[i]
		es := entries[:len(d.GetEntries()):len(d.GetEntries())]
		entries = entries[len(es):]
		for j, e := range d.GetEntries() {
			es[j] = descriptors.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		ed.Entries = es
		if h := d.GetHitsAddend(); h != nil {
			ed.Hits, ed.HasHits = h.GetValue(), true
		}
		ed.Refund = d.GetIsNegativeHits()
		if l := d.GetLimit(); l != nil {
			o, err := toOverride(i, l)
			if err != nil {
				return nil, err
			}
			ed.Override = o
		}
	}
	return out, nil
}

func toOverride(i int, l *ratelimitv3.RateLimitDescriptor_RateLimitOverride) (*engine.Override, error) {
	u, ok := overrideUnits[l.GetUnit()]
	if !ok {
		return nil, &descriptors.InputError{
			Field:   fmt.Sprintf("descriptors[%d].limit.unit", i),
			Message: fmt.Sprintf("unit %s is not supported", l.GetUnit()),
		}
	}
	o := &engine.Override{RequestsPerUnit: l.GetRequestsPerUnit(), Unit: u}
	if m := l.GetUnitMultiplier(); m != nil {
		if m.GetValue() == 0 {
			return nil, &descriptors.InputError{
				Field:   fmt.Sprintf("descriptors[%d].limit.unit_multiplier", i),
				Message: "must be at least 1 when set",
			}
		}
		o.Multiplier = m.GetValue()
	}
	return o, nil
}

// responseUnits maps tiers units to Envoy's response enum (WEEK = 7, MONTH = 5,
// YEAR = 6).
var responseUnits = [...]rlsv3.RateLimitResponse_RateLimit_Unit{
	tiers.UnitSecond: rlsv3.RateLimitResponse_RateLimit_SECOND,
	tiers.UnitMinute: rlsv3.RateLimitResponse_RateLimit_MINUTE,
	tiers.UnitHour:   rlsv3.RateLimitResponse_RateLimit_HOUR,
	tiers.UnitDay:    rlsv3.RateLimitResponse_RateLimit_DAY,
	tiers.UnitWeek:   rlsv3.RateLimitResponse_RateLimit_WEEK,
	tiers.UnitMonth:  rlsv3.RateLimitResponse_RateLimit_MONTH,
	tiers.UnitYear:   rlsv3.RateLimitResponse_RateLimit_YEAR,
}

func responseUnit(u tiers.Unit) rlsv3.RateLimitResponse_RateLimit_Unit {
	if int(u) < len(responseUnits) {
		return responseUnits[u]
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN
}

func protoCode(c engine.Code) rlsv3.RateLimitResponse_Code {
	if c == engine.CodeOverLimit {
		return rlsv3.RateLimitResponse_OVER_LIMIT
	}
	// Anything else, including a zero Code, is OK: Envoy must never see
	// UNKNOWN.
	return rlsv3.RateLimitResponse_OK
}

// toProtoResponse converts the engine's answer; statuses keep request order.
func toProtoResponse(r *engine.Response, headers bool, names [3]string) *rlsv3.RateLimitResponse {
	n := len(r.Statuses)
	out := &rlsv3.RateLimitResponse{
		OverallCode: protoCode(r.Code),
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, n),
	}
	// The statuses, their durations and their limits in three arrays
	// rather than three allocations per descriptor.
	statuses := make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
	durations := make([]durationpb.Duration, n)
	nl := 0
	for i := range r.Statuses {
		if r.Statuses[i].Limit != nil {
			nl++
		}
	}
	limits := make([]rlsv3.RateLimitResponse_RateLimit, nl)
	for i := range r.Statuses {
		st := &r.Statuses[i]
		ps := &statuses[i]
		ps.Code, ps.LimitRemaining = protoCode(st.Code), st.Remaining
		d := &durations[i]
		d.Seconds, d.Nanos = int64(st.ResetAfter/time.Second), int32(st.ResetAfter%time.Second)
		ps.DurationUntilReset = d
		if l := st.Limit; l != nil {
			pl := &limits[0]
			limits = limits[1:]
			pl.Name, pl.RequestsPerUnit, pl.Unit = l.Name, l.RequestsPerUnit, responseUnit(l.Unit)
			ps.CurrentLimit = pl
			if l.Multiplier > 1 {
				ps.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(l.Multiplier)
			}
		}
		out.Statuses[i] = ps
	}
	if headers {
		out.ResponseHeadersToAdd = rateLimitHeaders(r.Statuses, names)
	}
	return out
}

// decidingStatus is the status an answer's headers and attribution are
// taken from, as envoyproxy/ratelimit takes its headers': the last
// OVER_LIMIT status that is not a quota descriptor's (the limit that rejected
// the request), else the first limited status with the smallest remaining;
// -1 when no status is limited.
func decidingStatus(sts []engine.Status) int {
	best, rejected := -1, false
	for i := range sts {
		switch st := &sts[i]; {
		case st.Limit == nil:
		case st.Code == engine.CodeOverLimit && !st.Quota:
			best, rejected = i, true
		case !rejected && (best < 0 || st.Remaining < sts[best].Remaining):
			best = i
		}
	}
	return best
}

// rateLimitHeaders renders RateLimit-Limit, RateLimit-Remaining and
// RateLimit-Reset from the deciding status. The reset is whole seconds,
// rounded up.
func rateLimitHeaders(sts []engine.Status, names [3]string) []*corev3.HeaderValue {
	best := decidingStatus(sts)
	if best < 0 {
		return nil
	}
	st := &sts[best]
	// Whole seconds, rounded up, without overflowing when the reset is
	// "never" (the largest Duration).
	reset := st.ResetAfter / time.Second
	if st.ResetAfter%time.Second != 0 {
		reset++
	}
	return []*corev3.HeaderValue{
		{Key: names[0], Value: strconv.FormatUint(uint64(st.Limit.RequestsPerUnit), 10)},
		{Key: names[1], Value: strconv.FormatUint(uint64(st.Remaining), 10)},
		{Key: names[2], Value: strconv.FormatInt(int64(reset), 10)},
	}
}
