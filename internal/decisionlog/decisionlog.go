package decisionlog

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Options.
const (
	DefaultRate  = 1000
	DefaultQueue = 4096
)

// Results of a Record.
const (
	ResultGranted      = "granted"
	ResultRejected     = "rejected"
	ResultShadow       = "shadow"       // rejected by its limit, answered OK (shadow mode, ignore_limits)
	ResultUnconfigured = "unconfigured" // matched nothing in a domain with allow_unconfigured: granted
	// ResultNotLimited is a descriptor no limit applied to (no match,
	// unlimited, replaced, copy-limited), which only a complete log records.
	ResultNotLimited = "not_limited"
)

// EscrowLocal is a Record's Escrow when this replica decided it from its
// escrow leases of the pair, without a call to the shared store.
const EscrowLocal = "local"

// Entry is one key and value of a descriptor.
type Entry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Record is one line of the log: the decision of one descriptor.
type Record struct {
	Time time.Time `json:"time"`
	// RLSDomain and Entries are the request's; Resource and Domain what
	// they resolved to (empty for an unconfigured descriptor).
	RLSDomain string  `json:"rls_domain"`
	Entries   []Entry `json:"entries"`
	Resource  string  `json:"resource,omitempty"`
	Domain    string  `json:"domain,omitempty"`
	// Hits asked for and granted; Tier the current tier after the decision.
	Hits    int64 `json:"hits"`
	Granted int64 `json:"granted"`
	Tier    int   `json:"tier,omitempty"`
	// Result is one of the Result constants; Burst reports a grant that
	// entered a higher tier; LimitedBy, for a rejection, "tier", "hard" or
	// "global" (the rate policy's limits), or "quota" (the descriptor's
	// calendar quota, whose period ends at PeriodEnd).
	Result    string    `json:"result"`
	Burst     bool      `json:"burst,omitempty"`
	LimitedBy string    `json:"limited_by,omitempty"`
	PeriodEnd time.Time `json:"quota_period_end,omitzero"`
	// Escrow is EscrowLocal when the decision was made from this replica's
	// escrow leases (a grant from hits a lease held, or a rejection while
	// the pair's last lease was refused), without a call to the shared
	// store; empty when the shared store (or its failure mode) decided.
	Escrow string `json:"escrow,omitempty"`
	// Weight is how many decisions the line stands for: 1/sample for a
	// sampled line, 1 for a line always kept.
	Weight float64 `json:"weight"`
	// Request names the request the line is a descriptor of: the lines of
	// one request share it, and the requests of one Logger are numbered
	// in order after a random prefix ("3fa2c1d0-42"). OverLimit is the
	// request's answer. Refund and Override are the descriptor's
	// is_negative_hits and its own limit, when it has them.
	Request   string    `json:"request,omitempty"`
	OverLimit bool      `json:"over_limit,omitempty"`
	Refund    bool      `json:"refund,omitempty"`
	Override  *Override `json:"override,omitempty"`
	// Complete marks a line of a complete log (Options.All): every
	// descriptor of every request is logged, as far as the rate bound and
	// the queue let it (gaps in the request numbers show what they
	// dropped).
	Complete bool `json:"complete,omitempty"`
}

// Override is a request descriptor's own limit (Envoy's
// RateLimitOverride): RequestsPerUnit per Multiplier (0: one) Units, the
// unit written as in configuration ("second", "minute"...).
type Override struct {
	RequestsPerUnit uint32 `json:"requests_per_unit"`
	Unit            string `json:"unit"`
	Multiplier      uint32 `json:"multiplier,omitempty"`
}

// Options configure a Logger.
type Options struct {
	// Sample is the share, in [0, 1], of decisions that are not always
	// kept (grants that entered no higher tier, unconfigured grants) that
	// are logged.
	Sample float64
	// Rate bounds the lines written per second; 0 means DefaultRate,
	// negative means no bound.
	Rate int
	// Queue bounds the lines waiting for the writer; 0 means DefaultQueue.
	Queue int
	// Now is the clock of the rate bound; nil means time.Now.
	Now func() time.Time
	// All makes a complete log, for replay: every descriptor of every
	// request is kept (Keep always says yes, with weight 1), those no
	// limit applies to included; the rate bound and the queue still apply.
	All bool
}

// Stats counts a Logger's lines.
type Stats struct {
	Written uint64
	// DroppedRate and DroppedQueue count lines dropped by the rate bound and
	// because the queue was full; WriteErrors lines the writer failed on.
	DroppedRate, DroppedQueue, WriteErrors uint64
}

// Logger writes Records to a writer. Safe for concurrent use; create it
// with New and stop it with Close.
type Logger struct {
	w      io.Writer
	all    bool
	prefix string // the prefix of request names
	reqs   atomic.Uint64
	sample float64
	rate   int64
	now    func() time.Time
	q      chan *Record

	sec, inSec atomic.Int64 // the current second and the lines kept in it

	written, droppedRate, droppedQueue, writeErrors atomic.Uint64

	closeOnce sync.Once
	done      chan struct{}
	closer    io.Closer // what Open opened, closed by Close (nil: nothing)
}

// Open returns a Logger writing to target: "-" for standard output,
// "unix:PATH" for a Unix stream socket it connects to, else a file it
// appends to (created 0640 when missing). Close closes what Open opened.
func Open(target string, opts Options) (*Logger, error) {
	var w io.WriteCloser
	switch {
	case target == "":
		return nil, errors.New("decisionlog: no target")
	case target == "-":
		return New(os.Stdout, opts), nil
	case strings.HasPrefix(target, "unix:"):
		c, err := net.Dial("unix", strings.TrimPrefix(target, "unix:"))
		if err != nil {
			return nil, fmt.Errorf("decisionlog: %w", err)
		}
		w = c
	default:
		f, err := os.OpenFile(target, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
		if err != nil {
			return nil, fmt.Errorf("decisionlog: %w", err)
		}
		w = f
	}
	l := New(w, opts)
	l.closer = w
	return l, nil
}

// New returns a Logger writing to w and starts its writer goroutine.
func New(w io.Writer, opts Options) *Logger {
	l := &Logger{w: w, sample: min(max(opts.Sample, 0), 1), rate: int64(opts.Rate), now: opts.Now, done: make(chan struct{}),
		all: opts.All, prefix: strconv.FormatUint(uint64(rand.Uint32()), 16) + "-"}
	if l.all {
		l.sample = 1
	}
	if l.rate == 0 {
		l.rate = DefaultRate
	}
	if l.now == nil {
		l.now = time.Now
	}
	q := opts.Queue
	if q <= 0 {
		q = DefaultQueue
	}
	l.q = make(chan *Record, q)
	go l.run()
	return l
}

// Keep reports whether a decision's line is to be logged, and its weight:
// always (weight 1) when important (a rejection or a burst), else with
// probability Sample (weight 1/Sample); and within the rate bound, whose
// refusals are counted as dropped. Callers build the Record only when Keep
// says so.
func (l *Logger) Keep(important bool) (weight float64, ok bool) {
	weight = 1
	if !important {
		if l.sample <= 0 || (l.sample < 1 && rand.Float64() >= l.sample) {
			return 0, false
		}
		weight = 1 / l.sample
	}
	if l.rate > 0 {
		sec := l.now().Unix()
		if cur := l.sec.Load(); cur != sec && l.sec.CompareAndSwap(cur, sec) {
			l.inSec.Store(0)
		}
		if l.inSec.Add(1) > l.rate {
			l.droppedRate.Add(1)
			return 0, false
		}
	}
	return weight, true
}

// All reports whether the log is complete (Options.All).
func (l *Logger) All() bool { return l.all }

// NextRequest names the next request whose lines are logged.
func (l *Logger) NextRequest() string {
	return l.prefix + strconv.FormatUint(l.reqs.Add(1), 10)
}

// Log queues r for the writer, or drops it (counted) when the queue is full.
// r must not be changed afterwards.
func (l *Logger) Log(r *Record) {
	select {
	case l.q <- r:
	default:
		l.droppedQueue.Add(1)
	}
}

// Stats returns the counts so far.
func (l *Logger) Stats() Stats {
	return Stats{Written: l.written.Load(), DroppedRate: l.droppedRate.Load(), DroppedQueue: l.droppedQueue.Load(), WriteErrors: l.writeErrors.Load()}
}

// Close writes the lines queued so far and stops the writer. Log must not
// be called after Close.
func (l *Logger) Close() error {
	var err error
	l.closeOnce.Do(func() {
		close(l.q)
		<-l.done
		if l.closer != nil {
			err = l.closer.Close()
		}
	})
	<-l.done
	return err
}

func (l *Logger) run() {
	defer close(l.done)
	bw := bufio.NewWriterSize(l.w, 64<<10)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	for r := range l.q {
		if err := enc.Encode(r); err != nil {
			l.writeErrors.Add(1)
		} else {
			l.written.Add(1)
		}
		// Flush when nothing else is waiting: lines reach the file promptly
		// when traffic is light, in batches when it is heavy.
		if len(l.q) == 0 {
			if err := bw.Flush(); err != nil {
				l.writeErrors.Add(1)
				bw.Reset(l.w)
			}
		}
	}
	bw.Flush()
}

// ReadRecords calls f with each record of a decision log (JSON lines, blank
// lines skipped) and its line number, in order. A line that is not a record
// (not JSON, or without rls_domain, entries, hits >= 0 and weight >= 0) is an
// error naming its line, as is an error of f, which stops the reading.
// Replay and suggest read logs through it.
func ReadRecords(r io.Reader, f func(line int, rec *Record) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(strings.TrimSpace(string(line))) == 0 {
			continue
		}
		var rec Record
		if err := json.Unmarshal(line, &rec); err != nil {
			return fmt.Errorf("line %d: %v", n, err)
		}
		if rec.RLSDomain == "" || len(rec.Entries) == 0 || rec.Hits < 0 || rec.Weight < 0 {
			return fmt.Errorf("line %d: not a decision (rls_domain, entries, hits and weight are required)", n)
		}
		if err := f(n, &rec); err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
	}
	return sc.Err()
}
