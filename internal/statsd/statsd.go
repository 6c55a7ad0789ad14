// Package statsd sends envoyproxy/ratelimit's statsd stats (its USE_STATSD)
// over UDP or TCP, buffered so that counting never waits on the network.
package statsd

import (
	"errors"
	"log/slog"
	"time"

	"github.com/cactus/go-statsd-client/v5/statsd"
)

// Protocol is how the stats travel. The zero value is UDP. *Protocol is a
// flag.Value.
type Protocol uint8

const (
	// UDP sends datagrams of newline-separated lines, each at most 1,432
	// bytes; a lost datagram is not noticed.
	UDP Protocol = iota
	// TCP sends newline-separated lines over one connection, as
	// envoyproxy/ratelimit does by default (github.com/lyft/gostats'
	// STATSD_PROTOCOL=tcp), reconnecting when it breaks.
	TCP
)

// String returns "udp" or "tcp".
func (p Protocol) String() string {
	if p == TCP {
		return "tcp"
	}
	return "udp"
}

// Set parses "udp" or "tcp".
func (p *Protocol) Set(s string) error {
	switch s {
	case "udp":
		*p = UDP
	case "tcp":
		*p = TCP
	default:
		return errors.New("want udp or tcp")
	}
	return nil
}

// Options say where and how a Sink sends.
type Options struct {
	// Addr is the collector's host:port.
	Addr string
	// Protocol is UDP (the zero value) or TCP.
	Protocol Protocol
	// FlushInterval is the longest a stat waits in the buffer (0: 300ms
	// over UDP, 1s over TCP).
	FlushInterval time.Duration
	// Logger receives the TCP connection's failures and recoveries, and
	// how many stats were dropped (nil: none are logged).
	Logger *slog.Logger
}

// Sink is a statsd client. Safe for concurrent use; its methods never wait
// on the network: over TCP, what cannot be buffered while the collector is
// down or slow is dropped and counted (Dropped).
type Sink struct {
	c   statsd.Statter
	tcp *tcpSender // nil over UDP
}

// New starts a sink. Over UDP the address must resolve now; over TCP the
// collector is dialled in the background, and again whenever the
// connection breaks.
func New(o Options) (*Sink, error) {
	if o.Protocol == TCP {
		return newTCP(o, defaultTCPTuning)
	}
	c, err := statsd.NewClientWithConfig(&statsd.ClientConfig{Address: o.Addr, UseBuffered: true, FlushInterval: o.FlushInterval})
	if err != nil {
		return nil, err
	}
	return &Sink{c: c}, nil
}

func newTCP(o Options, tune tcpTuning) (*Sink, error) {
	t := newTCPSender(o.Addr, o.FlushInterval, o.Logger, tune)
	c, err := statsd.NewClientWithSender(t, "", 0)
	if err != nil {
		t.Close()
		return nil, err
	}
	return &Sink{c: c, tcp: t}, nil
}

// Count adds n to the counter name.
func (s *Sink) Count(name string, n int64) { _ = s.c.Inc(name, n, 1) }

// Timing records a duration, in milliseconds as statsd timers are.
func (s *Sink) Timing(name string, d time.Duration) { _ = s.c.TimingDuration(name, d, 1) }

// Dropped is how many stats were dropped so far over TCP because the
// collector could not take them (always 0 over UDP, where losses are not
// seen).
func (s *Sink) Dropped() uint64 {
	if s.tcp == nil {
		return 0
	}
	return s.tcp.dropped.Load()
}

// Close sends what is buffered and closes the socket; over TCP it waits at
// most a couple of seconds for the collector.
func (s *Sink) Close() error { return s.c.Close() }
