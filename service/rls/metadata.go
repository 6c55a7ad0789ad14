package rls

import (
	"strconv"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/server"
)

// dynamicMetadata is envoyproxy/ratelimit's response dynamic metadata
// (RESPONSE_DYNAMIC_METADATA): the domain; each descriptor's entries as
// "key=value" strings, its request-supplied limit and its hits_addend; the
// request's hits_addend; and the configured metadata of the descriptors
// that passed (neither over their limit nor unlimited), merged, the first
// one's value winning.
//
// Request bytes are written as the engine counts them: a value over
// descriptors.MaxLen bytes as its stand-in (engine.BoundValue), and bytes that
// are not UTF-8 as %XX (validLabel), since a protobuf string must be UTF-8:
// a response that cannot be marshalled would fail the call, and Envoy would
// grant it.
func dynamicMetadata(req *rlsv3.RateLimitRequest, resp *engine.Response) *structpb.Struct {
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(server.ValidLabel(req.GetDomain()))}
	descs := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, d := range req.GetDescriptors() {
		if d == nil {
			continue
		}
		entries := make([]*structpb.Value, 0, len(d.GetEntries()))
		for _, e := range d.GetEntries() {
			entries = append(entries, structpb.NewStringValue(server.ValidLabel(e.GetKey()+"="+engine.BoundValue(e.GetValue()))))
		}
		f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if l := d.GetLimit(); l != nil {
			f["limit"] = structpb.NewStringValue(prototext.MarshalOptions{}.Format(l))
		}
		if h := d.GetHitsAddend(); h != nil {
			f["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		descs = append(descs, structpb.NewStructValue(&structpb.Struct{Fields: f}))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: descs})
	if h := req.GetHitsAddend(); h != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	passed := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		l := st.Match.Limit
		if st.Code != engine.CodeOK || l == nil || l.Unlimited || len(l.Metadata) == 0 {
			continue
		}
		m, err := structpb.NewStruct(l.Metadata)
		if err != nil {
			continue // checked when the configuration was loaded
		}
		mergeMetadata(passed, m)
	}
	if len(passed.Fields) > 0 {
		fields["metadata"] = structpb.NewStructValue(passed)
	}
	return &structpb.Struct{Fields: fields}
}

// mergeMetadata adds src's fields to dst: a field dst has is kept, except
// that two structs merge.
func mergeMetadata(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		have, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = v
			continue
		}
		if hs, vs := have.GetStructValue(), v.GetStructValue(); hs != nil && vs != nil {
			mergeMetadata(hs, vs)
		}
	}
}

// addSlots writes, under AttributionKey of out's dynamic_metadata, the
// slots resp's request holds in concurrency limits: "slots", their number,
// and "slot", the instant they were stamped with in microseconds, as text
// (engine.Response.Slots, SlotsAt). Envoy's stream-done rate limit reads
// them back (its hits_addend from the first, its last descriptor entry,
// engine.SlotKey, from the second), so that a request that holds none (a
// rejection, Charon unreachable) sends no refund.
func addSlots(out *rlsv3.RateLimitResponse, resp *engine.Response) {
	if out.DynamicMetadata == nil {
		out.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	c := out.DynamicMetadata.Fields[AttributionKey].GetStructValue()
	if c == nil {
		c = &structpb.Struct{Fields: map[string]*structpb.Value{}}
		out.DynamicMetadata.Fields[AttributionKey] = structpb.NewStructValue(c)
	}
	c.Fields["slots"] = structpb.NewNumberValue(float64(resp.Slots))
	c.Fields["slot"] = structpb.NewStringValue(strconv.FormatInt(resp.SlotsAt.UnixMicro(), 10))
}
