package statsd

import (
	"bufio"
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// listen is a collector on a free loopback port.
func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// accept is the collector's next connection, with 20s to come.
func accept(t *testing.T, ln net.Listener) net.Conn {
	t.Helper()
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(20 * time.Second))
	c, err := ln.Accept()
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	return c
}

// TestTCPSink: over TCP the stats arrive as newline-terminated lines on one
// connection, sent at the flush interval without waiting for Close.
func TestTCPSink(t *testing.T) {
	ln := listen(t)
	s, err := New(Options{Addr: ln.Addr().String(), Protocol: TCP, FlushInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Count("ratelimit.service.rate_limit.d.k.total_hits", 3)
	s.Timing("ratelimit_server.ShouldRateLimit.response_time", 1500*time.Microsecond)
	s.Timing("ratelimit_server.ShouldRateLimit.response_time", 2*time.Millisecond)
	c := accept(t, ln)
	r := bufio.NewReader(c)
	for _, want := range []string{
		"ratelimit.service.rate_limit.d.k.total_hits:3|c\n",
		"ratelimit_server.ShouldRateLimit.response_time:1.5|ms\n",
		"ratelimit_server.ShouldRateLimit.response_time:2|ms\n",
	} {
		got, err := r.ReadString('\n')
		if err != nil || got != want {
			t.Fatalf("got line %q (%v), want %q", got, err, want)
		}
	}
	s.Count("last", 1)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(r)
	if err != nil || string(rest) != "last:1|c\n" {
		t.Errorf("after Close: got %q (%v), want %q and the end of the connection", rest, err, "last:1|c\n")
	}
	if d := s.Dropped(); d != 0 {
		t.Errorf("got %d dropped, want 0", d)
	}
}

// TestTCPReconnect: when the collector closes the connection, the sink dials
// again and later stats arrive on the new connection.
func TestTCPReconnect(t *testing.T) {
	ln := listen(t)
	tune := defaultTCPTuning
	tune.batchBytes = 1 // every line is queued at once
	tune.backoffMin, tune.backoffMax = time.Millisecond, 10*time.Millisecond
	s, err := newTCP(Options{Addr: ln.Addr().String(), FlushInterval: time.Hour}, tune)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c1 := accept(t, ln)
	s.Count("first", 1)
	if got, err := bufio.NewReader(c1).ReadString('\n'); got != "first:1|c\n" {
		t.Fatalf("first connection: got %q (%v), want %q", got, err, "first:1|c\n")
	}
	c1.Close()

	// Writes to the closed connection fail within a few lines; keep
	// counting until a line arrives on a second connection (the listener
	// may hand over a connection before the sink's dial has returned).
	next := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			next <- c
		}
	}()
	var r2 *bufio.Reader
	first := make(chan string, 1)
	deadline := time.After(20 * time.Second)
	for arrived := false; !arrived; {
		s.Count("probe", 1)
		select {
		case c2 := <-next:
			defer c2.Close()
			c2.SetReadDeadline(time.Now().Add(20 * time.Second))
			r2 = bufio.NewReader(c2)
			go func() {
				l, _ := r2.ReadString('\n')
				first <- l
			}()
		case l := <-first:
			if l != "probe:1|c\n" {
				t.Fatalf("second connection: got %q, want %q", l, "probe:1|c\n")
			}
			arrived = true
		case <-deadline:
			t.Fatal("no line on a second connection")
		case <-time.After(time.Millisecond):
		}
	}
	s.Count("after", 1)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r2)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(got), "\n"), "\n")
	if lines[len(lines)-1] != "after:1|c" {
		t.Errorf("second connection: got %q, want it to end with %q", got, "after:1|c\n")
	}
	for _, l := range lines[:len(lines)-1] {
		if l != "probe:1|c" {
			t.Errorf("second connection: got line %q, want probe:1|c", l)
		}
	}
}

// pipes dials net.Pipe connections whose far ends never read: a collector
// that accepts and then stalls. first receives the first far end.
type pipes struct {
	first chan net.Conn
	mu    sync.Mutex
	far   []net.Conn
}

func (p *pipes) dial(context.Context, string) (net.Conn, error) {
	near, far := net.Pipe()
	p.mu.Lock()
	if len(p.far) == 0 {
		p.first <- far
	}
	p.far = append(p.far, far)
	p.mu.Unlock()
	return near, nil
}

func (p *pipes) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.far {
		c.Close()
	}
}

// TestTCPDeadCollector: with the collector refusing connections, or
// accepting and never reading, counting still returns at once, what does not
// fit the bounded buffer is dropped and counted, Close returns, and no
// goroutine is left behind.
func TestTCPDeadCollector(t *testing.T) {
	ln := listen(t)
	refused := ln.Addr().String()
	ln.Close()
	for _, tc := range []struct {
		name  string
		stall bool // accept and never read, or refuse
	}{
		{"refused", false},
		{"never reads", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tune := defaultTCPTuning
			tune.batchBytes, tune.queueLen = 64, 2 // 3 batches of 64 bytes at most: the rest is dropped
			tune.writeTimeout = time.Hour          // a stalled write is cut short by Close only
			tune.closeTimeout = 0
			var far *pipes
			if tc.stall {
				far = &pipes{first: make(chan net.Conn, 1)}
				tune.dial = far.dial
			}
			s, err := newTCP(Options{Addr: refused, FlushInterval: time.Hour}, tune)
			if err != nil {
				t.Fatal(err)
			}
			const n = 1000 // 15 KB of lines
			for range n {
				s.Count("ratelimit.x", 1) // a call that waited on the network would hang the test here
			}
			if far != nil {
				// One byte read: the sink is now stuck writing the rest
				// of a batch, for Close to cut short.
				if _, err := io.ReadFull(<-far.first, make([]byte, 1)); err != nil {
					t.Fatal(err)
				}
			}
			if d := s.Dropped(); d == 0 {
				t.Errorf("before Close: got %d dropped, want some", d)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if d := s.Dropped(); d != n {
				t.Errorf("after Close: got %d dropped, want %d (none was delivered)", d, n)
			}
			if far != nil {
				far.close()
			}
			goleak.VerifyNone(t)
		})
	}
}
