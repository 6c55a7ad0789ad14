package statsd

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// tcpTuning bounds what the TCP sender holds and waits for; tests shrink it.
type tcpTuning struct {
	batchBytes   int           // a batch is queued for the connection once this long
	queueLen     int           // most batches queued: beyond, a batch is dropped
	dialTimeout  time.Duration // one dial
	writeTimeout time.Duration // one batch's write: a collector slower than that is dropped
	closeTimeout time.Duration // Close's wait for the last batches
	backoffMin   time.Duration // the wait before redialling after a failed dial, doubled
	backoffMax   time.Duration // up to this
	logEvery     time.Duration // at most one "dropped" log per this
	// dial connects; nil dials TCP.
	dial func(ctx context.Context, addr string) (net.Conn, error)
}

// defaultTCPTuning holds about 4 MiB at most, and waits on a collector about
// as long as github.com/lyft/gostats' TCP sink does (which
// envoyproxy/ratelimit uses): 64 KiB batches, 1.5s dials, 1s writes.
var defaultTCPTuning = tcpTuning{
	batchBytes:   64 << 10,
	queueLen:     64,
	dialTimeout:  1500 * time.Millisecond,
	writeTimeout: time.Second,
	closeTimeout: 2 * time.Second,
	backoffMin:   100 * time.Millisecond,
	backoffMax:   5 * time.Second,
	logEvery:     time.Minute,
}

// batch is newline-terminated statsd lines.
type batch struct {
	b     []byte
	lines uint64
}

// tcpSender is a go-statsd-client Sender that writes lines to a TCP
// connection from its own goroutine. Send only appends to a buffer and
// hands full buffers over without waiting: when the queue is full (the
// collector is down or slower than the stats come) the batch is dropped and
// counted.
type tcpSender struct {
	addr  string
	flush time.Duration
	log   *slog.Logger
	tune  tcpTuning

	mu     sync.Mutex
	cur    batch
	closed bool
	end    time.Time // with closed: Close's deadline
	live   net.Conn  // the connection being written, for Close to cut short

	queue   chan batch
	free    chan []byte // written batches' buffers, reused
	dropped atomic.Uint64
	stop    context.CancelFunc // ends a dial in progress
	ctx     context.Context
	closing chan struct{}
	done    chan struct{}
}

func newTCPSender(addr string, flush time.Duration, log *slog.Logger, tune tcpTuning) *tcpSender {
	if flush <= 0 {
		flush = time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if tune.dial == nil {
		d := net.Dialer{Timeout: tune.dialTimeout}
		tune.dial = func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
	}
	ctx, stop := context.WithCancel(context.Background())
	t := &tcpSender{
		addr: addr, flush: flush, log: log, tune: tune,
		queue:   make(chan batch, tune.queueLen),
		free:    make(chan []byte, tune.queueLen+2),
		ctx:     ctx,
		stop:    stop,
		closing: make(chan struct{}),
		done:    make(chan struct{}),
	}
	t.cur.b = make([]byte, 0, tune.batchBytes)
	go t.run()
	return t
}

// Send appends one line (data without its newline); it never waits on the
// network.
func (t *tcpSender) Send(data []byte) (int, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		t.dropped.Add(1)
		return 0, net.ErrClosed
	}
	if len(t.cur.b) > 0 && len(t.cur.b)+len(data)+1 > t.tune.batchBytes {
		t.queueLocked()
	}
	t.cur.b = append(append(t.cur.b, data...), '\n')
	t.cur.lines++
	if len(t.cur.b) >= t.tune.batchBytes {
		t.queueLocked()
	}
	t.mu.Unlock()
	return len(data), nil
}

// queueLocked hands the current batch to the writer, or drops it if the
// queue is full. t.mu is held.
func (t *tcpSender) queueLocked() {
	if t.cur.lines == 0 {
		return
	}
	select {
	case t.queue <- t.cur:
	default:
		t.dropped.Add(t.cur.lines)
		t.cur.b, t.cur.lines = t.cur.b[:0], 0
		return
	}
	select {
	case b := <-t.free:
		t.cur.b = b[:0]
	default:
		t.cur.b = make([]byte, 0, t.tune.batchBytes)
	}
	t.cur.lines = 0
}

// Close sends what is queued, waiting at most closeTimeout, and stops the
// writer.
func (t *tcpSender) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.queueLocked()
	t.closed = true
	t.end = time.Now().Add(t.tune.closeTimeout)
	if t.live != nil {
		_ = t.live.SetWriteDeadline(t.end) // a write in progress waits no longer
	}
	t.mu.Unlock()
	close(t.closing)
	t.stop()
	<-t.done
	return nil
}

// setLive records the connection being written (nil: none).
func (t *tcpSender) setLive(c net.Conn) {
	t.mu.Lock()
	t.live = c
	t.mu.Unlock()
}

// write writes b whole before its deadline: writeTimeout from now, or
// Close's deadline once closing. The deadline is set under t.mu so that
// Close's cannot be overwritten by a later one.
func (t *tcpSender) write(c net.Conn, b batch) error {
	t.mu.Lock()
	deadline := time.Now().Add(t.tune.writeTimeout)
	if t.closed {
		deadline = t.end
	}
	err := c.SetWriteDeadline(deadline)
	t.mu.Unlock()
	if err == nil {
		_, err = c.Write(b.b)
	}
	return err
}

// recycle keeps b's buffer for a later batch.
func (t *tcpSender) recycle(b batch) {
	select {
	case t.free <- b.b:
	default:
	}
}

// run is the writer: it dials, writes the queued batches and queues the
// current one every flush interval. On an error it closes the connection,
// drops the batch and dials again after backoffMin, doubled after each
// failed dial or write up to backoffMax (with jitter), and back to
// backoffMin once a write succeeds.
func (t *tcpSender) run() {
	defer close(t.done)
	tick := time.NewTicker(t.flush)
	defer tick.Stop()
	var (
		conn     net.Conn
		retry    *time.Timer
		retryC   <-chan time.Time
		backoff  = t.tune.backoffMin
		down     bool   // the outage is logged
		reported uint64 // dropped, as last logged
		lastLog  time.Time
	)
	wait := func() {
		retry = time.NewTimer(backoff/2 + rand.N(backoff/2+1))
		retryC = retry.C
		backoff = min(2*backoff, t.tune.backoffMax)
	}
	for {
		if conn == nil && retryC == nil {
			c, err := t.tune.dial(t.ctx, t.addr)
			switch {
			case err == nil:
				conn = c
				t.setLive(c)
				if down {
					down = false
					t.log.Info("statsd: collector reached", "addr", t.addr, "dropped_total", t.dropped.Load())
				}
			case t.ctx.Err() != nil: // closing
			default:
				if !down {
					down = true
					t.log.Warn("statsd: cannot reach the collector; stats are dropped until it is back", "addr", t.addr, "err", err.Error())
				}
				wait()
			}
		}
		var queue <-chan batch
		if conn != nil {
			queue = t.queue
		}
		select {
		case <-t.closing:
			if retry != nil {
				retry.Stop()
			}
			t.finish(conn)
			return
		case <-retryC:
			retryC = nil
		case <-tick.C:
			t.mu.Lock()
			t.queueLocked()
			t.mu.Unlock()
			if d := t.dropped.Load(); d != reported && time.Since(lastLog) >= t.tune.logEvery {
				t.log.Warn("statsd: stats dropped: the collector is down or slower than they come", "addr", t.addr, "dropped_total", d)
				reported, lastLog = d, time.Now()
			}
		case b := <-queue:
			if err := t.write(conn, b); err != nil {
				t.dropped.Add(b.lines)
				_ = conn.Close()
				conn = nil
				t.setLive(nil)
				if !down {
					down = true
					t.log.Warn("statsd: the connection to the collector failed; reconnecting", "addr", t.addr, "err", err.Error())
				}
				wait()
			} else {
				backoff = t.tune.backoffMin
			}
			t.recycle(b)
		}
	}
}

// finish writes what is queued before Close's deadline, dialling once if
// there is no connection, and drops (counting) what it cannot write.
func (t *tcpSender) finish(conn net.Conn) {
	if len(t.queue) > 0 && conn == nil {
		t.mu.Lock()
		end := t.end
		t.mu.Unlock()
		ctx, cancel := context.WithDeadline(context.Background(), end)
		c, err := t.tune.dial(ctx, t.addr)
		cancel()
		if err == nil {
			conn = c
			t.setLive(c)
		}
	}
	for {
		select {
		case b := <-t.queue:
			if conn != nil {
				if err := t.write(conn, b); err != nil {
					_ = conn.Close()
					conn = nil
				}
			}
			if conn == nil {
				t.dropped.Add(b.lines)
			}
		default:
			if conn != nil {
				_ = conn.Close()
			}
			t.setLive(nil)
			return
		}
	}
}
