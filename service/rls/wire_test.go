package rls

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/server"
)

func sampleRequest() *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 3, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}, {Key: "path", Value: "/login"}}},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "ü"}},
			Limit:      &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_MINUTE, UnitMultiplier: wrapperspb.UInt32(2)},
			HitsAddend: wrapperspb.UInt64(0), IsNegativeHits: true},
	}}
}

// invalidUTF8Request is the wire form of a request whose domain, key and
// value hold bytes that are not UTF-8, as Envoy may forward them.
func invalidUTF8Request() []byte {
	entry := protowire.AppendTag(nil, 1, protowire.BytesType)
	entry = protowire.AppendString(entry, "user\xfe")
	entry = protowire.AppendTag(entry, 2, protowire.BytesType)
	entry = protowire.AppendString(entry, "\xff\xfe")
	desc := protowire.AppendTag(nil, 1, protowire.BytesType)
	desc = protowire.AppendBytes(desc, entry)
	b := protowire.AppendTag(nil, 1, protowire.BytesType)
	b = protowire.AppendString(b, "edge\xff")
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	return protowire.AppendBytes(b, desc)
}

func TestDecodeRequestInvalidUTF8(t *testing.T) {
	b := invalidUTF8Request()
	if err := proto.Unmarshal(b, &rlsv3.RateLimitRequest{}); err == nil {
		t.Fatal("proto.Unmarshal accepted invalid UTF-8: the test proves nothing")
	}
	var m rlsv3.RateLimitRequest
	if err := decodeRequest(b, &m); err != nil {
		t.Fatal(err)
	}
	e := m.GetDescriptors()[0].GetEntries()[0]
	if m.Domain != "edge\xff" || e.Key != "user\xfe" || e.Value != "\xff\xfe" {
		t.Errorf("decoded %q %q %q", m.Domain, e.Key, e.Value)
	}
}

func TestDecodeRequestMatchesProto(t *testing.T) {
	for _, m := range []proto.Message{sampleRequest(), &rlsv3.RateLimitRequest{}} {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		checkDecode(t, b)
		// Repeated occurrences merge; unknown fields are kept.
		b = append(b, b...)
		b = protowire.AppendTag(b, 99, protowire.VarintType)
		b = protowire.AppendVarint(b, 5)
		checkDecode(t, b)
	}
}

// checkDecode: where proto.Unmarshal succeeds, decodeRequest gives the
// same message; where it fails for anything but UTF-8, decodeRequest fails.
func checkDecode(t *testing.T, b []byte) {
	t.Helper()
	var want, got rlsv3.RateLimitRequest
	werr := proto.Unmarshal(b, &want)
	gerr := decodeRequest(b, &got)
	switch {
	case werr == nil && gerr != nil:
		t.Fatalf("%x: proto.Unmarshal accepts, decodeRequest: %v", b, gerr)
	case werr == nil && !proto.Equal(&want, &got):
		t.Fatalf("%x: decoded\n%v\nwant\n%v", b, &got, &want)
	case werr != nil && !strings.Contains(werr.Error(), "UTF-8") && gerr == nil:
		t.Fatalf("%x: proto.Unmarshal: %v; decodeRequest accepts", b, werr)
	}
}

func FuzzDecodeRequest(f *testing.F) {
	b, _ := proto.Marshal(sampleRequest())
	f.Add(b)
	f.Add(invalidUTF8Request())
	f.Add([]byte{0x0a, 0x01})
	f.Fuzz(checkDecode)
}

// TestInvalidUTF8OverGRPC: a request whose value holds bytes that are not
// UTF-8 is decided and limited like any other (with its own counter, and a
// metric label written %XX), not refused.
func TestInvalidUTF8OverGRPC(t *testing.T) {
	s := engineServer(t, "edge\xff", Options{}, server.Options{}, &descriptors.Node{Key: "user\xfe", Limit: &descriptors.Limit{DetailedMetric: true, Policy: perMinute(2)}})
	cc := dial(t, s.GRPCAddr())
	ask := func(b []byte) rlsv3.RateLimitResponse_Code {
		t.Helper()
		var resp rlsv3.RateLimitResponse
		err := cc.Invoke(context.Background(), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
			rawMessage(b), &resp, grpc.ForceCodecV2(rawCodec{}))
		if err != nil {
			t.Fatalf("ShouldRateLimit with bytes that are not UTF-8: %v", err)
		}
		return resp.OverallCode
	}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := ask(invalidUTF8Request()); got != want {
			t.Errorf("request %d: %v, want %v", i+1, got, want)
		}
	}
	other := bytes.Replace(invalidUTF8Request(), []byte("\xff\xfe"), []byte("\xfe\xff"), 1)
	if got := ask(other); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("another value: %v, want OK (its own counter)", got)
	}
	body, _ := get(t, "http://"+s.DebugAddr()+"/metrics")
	if !strings.Contains(body, `charon_rate_limit_over_limit{domain="edge%FF",key="edge%FF.user%FE_%FF%FE"} 1`) {
		t.Errorf("/metrics lacks the over-limit count with %%XX labels:\n%s", grepLines(body, "over_limit"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// rawMessage is an already encoded request, sent as it is.
type rawMessage []byte

type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(rawMessage))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

func BenchmarkDecodeRequest(b *testing.B) {
	raw, _ := proto.Marshal(sampleRequest())
	b.Run("proto.Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var m rlsv3.RateLimitRequest
			if err := proto.Unmarshal(raw, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decodeRequest", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var m rlsv3.RateLimitRequest
			if err := decodeRequest(raw, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestInvalidUTF8OverJSON: /json takes a value with a stray byte and
// limits it (the byte read as Latin-1), instead of answering 400.
func TestInvalidUTF8OverJSON(t *testing.T) {
	s := engineServer(t, "edge", Options{}, server.Options{}, &descriptors.Node{Key: "user", Limit: &descriptors.Limit{Policy: perMinute(1)}})
	body := "{\"domain\":\"edge\",\"descriptors\":[{\"entries\":[{\"key\":\"user\",\"value\":\"a\xff\"}]}]}"
	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		resp, err := http.Post("http://"+s.HTTPAddr()+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("request %d: %d %s, want %d", i+1, resp.StatusCode, b, want)
		}
	}
}
