package rls

import (
	"errors"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Envoy forwards header bytes as they are, and protobuf's decoder refuses a
// string that is not valid UTF-8: the whole RPC would fail, and behind
// Envoy's usual failure_mode_deny: false a failure is a grant, so one odd
// byte in a header would lift the limit. The server decodes
// RateLimitRequest itself, keeping such bytes as they are (the engine
// escapes them in identities like any other non-ASCII byte), and otherwise
// exactly as proto.Unmarshal does: the same fields, the same merging of
// repeated occurrences, unknown fields kept.

var errWire = errors.New("proto: cannot parse invalid wire-format data")

// codec is gRPC's proto codec, but for RateLimitRequest.
type codec struct{ encoding.CodecV2 }

func newCodec() codec { return codec{encoding.GetCodecV2("proto")} }

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*rlsv3.RateLimitRequest)
	if !ok {
		return c.CodecV2.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	m.Reset()
	return decodeRequest(buf.ReadOnlyData(), m)
}

// field reads one field from b: its number, wire type, the value's bytes
// as encoded (raw) and, for a length-delimited field, its payload (val),
// and the length of the whole field. n < 0 on malformed input.
func field(b []byte) (num protowire.Number, typ protowire.Type, raw, val []byte, n int) {
	num, typ, tn := protowire.ConsumeTag(b)
	if tn < 0 || !num.IsValid() {
		return 0, 0, nil, nil, -1
	}
	vn := protowire.ConsumeFieldValue(num, typ, b[tn:])
	if vn < 0 {
		return 0, 0, nil, nil, -1
	}
	raw = b[tn : tn+vn]
	val = raw
	if typ == protowire.BytesType {
		val, _ = protowire.ConsumeBytes(raw)
	}
	return num, typ, raw, val, tn + vn
}

func varint(b []byte) uint64 {
	v, _ := protowire.ConsumeVarint(b)
	return v
}

// message returns the message field *p, first setting it to an empty
// message when unset: a message field that occurs again merges into the
// one decoded so far.
func message[T any](p **T) *T {
	if *p == nil {
		*p = new(T)
	}
	return *p
}

// decodeWrapper decodes w, a wrappers.proto message of an unsigned integer,
// into its value v.
func decodeWrapper[T uint32 | uint64](b []byte, w proto.Message, v *T) error {
	return decodeFields(b, w, func(num protowire.Number, typ protowire.Type, val []byte) (bool, error) {
		if num != 1 || typ != protowire.VarintType {
			return false, nil
		}
		*v = T(varint(val))
		return true, nil
	})
}

// decodeFields calls f with every field of b; f reports whether it took
// the field, and the ones it did not take are kept as unknown fields of m.
func decodeFields(b []byte, m proto.Message, f func(num protowire.Number, typ protowire.Type, val []byte) (bool, error)) error {
	var unknown []byte
	for len(b) > 0 {
		num, typ, raw, val, n := field(b)
		if n < 0 {
			return errWire
		}
		took, err := f(num, typ, val)
		if err != nil {
			return err
		}
		if !took {
			// As proto.Unmarshal keeps it: the tag re-encoded, the value
			// as it came.
			unknown = protowire.AppendTag(unknown, num, typ)
			unknown = append(unknown, raw...)
		}
		b = b[n:]
	}
	if unknown != nil {
		r := m.ProtoReflect()
		r.SetUnknown(append(r.GetUnknown(), unknown...))
	}
	return nil
}

func decodeRequest(b []byte, m *rlsv3.RateLimitRequest) error {
	return decodeFields(b, m, func(num protowire.Number, typ protowire.Type, val []byte) (bool, error) {
		switch {
		case num == 1 && typ == protowire.BytesType:
			m.Domain = string(val)
		case num == 2 && typ == protowire.BytesType:
			d := &ratelimitv3.RateLimitDescriptor{}
			m.Descriptors = append(m.Descriptors, d)
			return true, decodeDescriptor(val, d)
		case num == 3 && typ == protowire.VarintType:
			m.HitsAddend = uint32(varint(val))
		default:
			return false, nil
		}
		return true, nil
	})
}

func decodeDescriptor(b []byte, d *ratelimitv3.RateLimitDescriptor) error {
	return decodeFields(b, d, func(num protowire.Number, typ protowire.Type, val []byte) (bool, error) {
		switch {
		case num == 1 && typ == protowire.BytesType:
			e := &ratelimitv3.RateLimitDescriptor_Entry{}
			d.Entries = append(d.Entries, e)
			return true, decodeFields(val, e, func(num protowire.Number, typ protowire.Type, val []byte) (bool, error) {
				switch {
				case num == 1 && typ == protowire.BytesType:
					e.Key = string(val)
				case num == 2 && typ == protowire.BytesType:
					e.Value = string(val)
				default:
					return false, nil
				}
				return true, nil
			})
		case num == 2 && typ == protowire.BytesType:
			return true, decodeOverride(val, message(&d.Limit))
		case num == 3 && typ == protowire.BytesType:
			w := message(&d.HitsAddend)
			return true, decodeWrapper(val, w, &w.Value)
		case num == 4 && typ == protowire.VarintType:
			d.IsNegativeHits = varint(val) != 0
		default:
			return false, nil
		}
		return true, nil
	})
}

func decodeOverride(b []byte, l *ratelimitv3.RateLimitDescriptor_RateLimitOverride) error {
	return decodeFields(b, l, func(num protowire.Number, typ protowire.Type, val []byte) (bool, error) {
		switch {
		case num == 1 && typ == protowire.VarintType:
			l.RequestsPerUnit = uint32(varint(val))
		case num == 2 && typ == protowire.VarintType:
			l.Unit = typev3.RateLimitUnit(int32(varint(val)))
		case num == 3 && typ == protowire.BytesType:
			w := message(&l.UnitMultiplier)
			return true, decodeWrapper(val, w, &w.Value)
		default:
			return false, nil
		}
		return true, nil
	})
}
