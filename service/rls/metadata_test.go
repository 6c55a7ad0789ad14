package rls

import (
	"strings"
	"testing"
	"unicode/utf8"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/engine"
)

// metadataOf is the dynamic metadata of a request of one descriptor (key,
// value) in domain, with its response marshalled as the server sends it.
func metadataOf(t *testing.T, domain, key, value string) (entry, dom string) {
	t.Helper()
	req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: 2, Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries:    []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: value}},
		HitsAddend: wrapperspb.UInt64(3),
	}}}
	resp := &engine.Response{Code: engine.CodeOK, Statuses: []engine.Status{{Code: engine.CodeOK}}}
	out := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, DynamicMetadata: dynamicMetadata(req, resp)}
	if _, err := proto.Marshal(out); err != nil {
		t.Fatalf("domain %q, %q=%q: the response does not marshal: %v", domain, key, value, err)
	}
	f := out.DynamicMetadata.GetFields()
	d := f["descriptors"].GetListValue().GetValues()[0].GetStructValue().GetFields()
	return d["entries"].GetListValue().GetValues()[0].GetStringValue(), f["domain"].GetStringValue()
}

// TestDynamicMetadataHostileBytes: request bytes that are not UTF-8, or a
// value over descriptors.MaxLen, never fail the call: they are written %XX, and
// under the engine's stand-in.
func TestDynamicMetadataHostileBytes(t *testing.T) {
	long := strings.Repeat("v", 5000)
	for _, tc := range []struct {
		name, domain, key, value string
		entry, dom               string
	}{
		{"plain", "d", "k", "v", "k=v", "d"},
		{"value not UTF-8", "d", "k", "a\xffb", "k=a%FFb", "d"},
		{"key not UTF-8", "d", "\xc3", "v", "%C3=v", "d"},
		{"domain not UTF-8", "d\xfe", "k", "v", "k=v", "d%FE"},
		{"UTF-8 kept", "d", "ключ", "значение ✓", "ключ=значение ✓", "d"},
		{"long value", "d", "k", long, "k=" + engine.BoundValue(long), "d"},
		{"long value not UTF-8", "d", "k", long + "\xff", "k=" + engine.BoundValue(long+"\xff"), "d"},
	} {
		entry, dom := metadataOf(t, tc.domain, tc.key, tc.value)
		if entry != tc.entry || dom != tc.dom {
			t.Errorf("%s: entry %.40q…, domain %q; want %.40q…, %q", tc.name, entry, dom, tc.entry, tc.dom)
		}
	}
}

// FuzzDynamicMetadata: whatever bytes a descriptor or domain carries, the
// response with its dynamic metadata marshals, in valid UTF-8, and no value
// makes an entry longer than its key and a stand-in (written %XX, at most
// three bytes a byte).
func FuzzDynamicMetadata(f *testing.F) {
	f.Add("d", "k", "v")
	f.Add("d\xff", "\xc3\x28", "\xed\xa0\x80")
	f.Add("d", "k", strings.Repeat("\xff", 2000))
	f.Fuzz(func(t *testing.T, domain, key, value string) {
		entry, dom := metadataOf(t, domain, key, value)
		if !utf8.ValidString(entry) || !utf8.ValidString(dom) {
			t.Errorf("not UTF-8: %q, %q", entry, dom)
		}
		if max := 3 * (len(key) + 1 + descriptors.MaxLen); len(entry) > max {
			t.Errorf("entry of %d bytes, more than %d", len(entry), max)
		}
	})
}
