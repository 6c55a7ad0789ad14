package statsd

import (
	"net"
	"strings"
	"testing"
	"time"
)

func TestSink(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	s, err := New(Options{Addr: pc.LocalAddr().String(), FlushInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s.Count("ratelimit.service.rate_limit.d.k.total_hits", 3)
	s.Timing("ratelimit_server.ShouldRateLimit.response_time", 1500*time.Microsecond)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	buf := make([]byte, 64<<10)
	pc.SetReadDeadline(time.Now().Add(20 * time.Second))
	for !strings.Contains(got.String(), "response_time") {
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			t.Fatalf("%v; got %q", err, got.String())
		}
		got.Write(buf[:n])
		got.WriteByte('\n')
	}
	for _, want := range []string{"ratelimit.service.rate_limit.d.k.total_hits:3|c", "ratelimit_server.ShouldRateLimit.response_time:1.5|ms"} {
		if !strings.Contains(got.String(), want) {
			t.Errorf("packets %q lack %q", got.String(), want)
		}
	}
}

func TestProtocolSet(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Protocol
		ok   bool
	}{
		{"udp", UDP, true},
		{"tcp", TCP, true},
		{"TCP", UDP, false},
		{"tcp4", UDP, false},
		{"unix", UDP, false},
		{"", UDP, false},
	} {
		var p Protocol
		err := p.Set(tc.in)
		if (err == nil) != tc.ok || p != tc.want {
			t.Errorf("Set(%q): got %v, %v; want %v, ok %v", tc.in, p, err, tc.want, tc.ok)
		}
		if tc.ok && p.String() != tc.in {
			t.Errorf("Set(%q).String(): got %q, want %q", tc.in, p.String(), tc.in)
		}
	}
	if got := Protocol(0).String(); got != "udp" {
		t.Errorf("zero Protocol: got %q, want udp", got)
	}
}
