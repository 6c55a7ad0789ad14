// Package statsd sends envoyproxy/ratelimit's statsd stats (its USE_STATSD)
// over UDP, buffered so that counting never waits on the network.
package statsd

import (
	"time"

	"github.com/cactus/go-statsd-client/v5/statsd"
)

// Sink is a statsd client. Safe for concurrent use.
type Sink struct {
	c statsd.Statter
}

// New sends to addr (host:port), flushing every flush (at the latest).
func New(addr string, flush time.Duration) (*Sink, error) {
	c, err := statsd.NewClientWithConfig(&statsd.ClientConfig{Address: addr, UseBuffered: true, FlushInterval: flush})
	if err != nil {
		return nil, err
	}
	return &Sink{c: c}, nil
}

// Count adds n to the counter name.
func (s *Sink) Count(name string, n int64) { _ = s.c.Inc(name, n, 1) }

// Timing records a duration, in milliseconds as statsd timers are.
func (s *Sink) Timing(name string, d time.Duration) { _ = s.c.TimingDuration(name, d, 1) }

// Close flushes what is buffered and closes the socket.
func (s *Sink) Close() error { return s.c.Close() }
