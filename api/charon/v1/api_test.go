package charonv1

import (
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// TestService pins the shape of the service that clients depend on.
func TestService(t *testing.T) {
	sd := File_charon_v1_charon_proto.Services().ByName("Charon")
	if sd == nil || sd.FullName() != "charon.v1.Charon" {
		t.Fatalf("service charon.v1.Charon not found")
	}
	want := map[protoreflect.Name]bool{ // name -> streaming
		"Request": false, "Reserve": false, "Release": false, "Transfer": false,
		"Seize": false, "KeepAlive": false, "Session": true, "Explain": false, "Usage": false,
	}
	if sd.Methods().Len() != len(want) {
		t.Errorf("%d methods, want %d", sd.Methods().Len(), len(want))
	}
	for name, stream := range want {
		m := sd.Methods().ByName(name)
		if m == nil {
			t.Errorf("method %s missing", name)
			continue
		}
		if m.IsStreamingClient() != stream || m.IsStreamingServer() != stream {
			t.Errorf("method %s: streaming %v/%v, want %v", name, m.IsStreamingClient(), m.IsStreamingServer(), stream)
		}
	}
	if Charon_Session_FullMethodName != "/charon.v1.Charon/Session" {
		t.Errorf("session method %q", Charon_Session_FullMethodName)
	}
	// Every operation of the unary API can travel on a session (Explain
	// and Usage, which change nothing and hold nothing, need not).
	ops := (&SessionRequest{}).ProtoReflect().Descriptor().Oneofs().ByName("operation")
	if ops.Fields().Len() != len(want)-3 {
		t.Errorf("session operations: %d, want %d", ops.Fields().Len(), len(want)-3)
	}
}
