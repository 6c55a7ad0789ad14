package tierstest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/charonlimit/charon/tiers"
)

// DefaultStart is the instant "at 0s" names in a script with no start line.
var DefaultStart = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)

// Script is one scenario script: a valid policy and its steps.
type Script struct {
	Name   string // the file's base name without .txt
	Policy tiers.Policy
	Start  time.Time
	Steps  []Step
}

// Op is what a step does.
type Op int

// Steps' operations.
const (
	// OpRequest asks for Copies hits, at least Min (tiers.Request).
	OpRequest Op = iota
	// OpRefund gives Copies hits back (tiers.Refund).
	OpRefund
	// OpForget expects ForgetAt of the domain's state to be Forget.
	OpForget
)

// Step is one line "at ..." of a script.
type Step struct {
	Where  string // "file:line"
	At     time.Time
	Domain string
	Op     Op
	Copies int64 // OpRequest: the copies asked; OpRefund: the hits given back
	Min    int64 // OpRequest
	// SlotsAt is, for OpRefund, the instant the slots given back were
	// taken at ("slots D"; tiers.RefundSlots), the zero Time for none
	// (tiers.Refund).
	SlotsAt time.Time
	// Forget is the ForgetAt expected by OpForget: tiers.Forever for
	// "never", the zero Time for "none".
	Forget time.Time
	expect []expectation
}

type expectation struct {
	key string
	n   int64
	d   time.Duration
}

// Dir returns the directory of package tiers' scripts, found from this
// package's source file (tests run from the module's source tree).
func Dir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok || !filepath.IsAbs(file) {
		return "", fmt.Errorf("tierstest: cannot locate the source of package tierstest (built with -trimpath?)")
	}
	return filepath.Join(filepath.Dir(file), "..", "testdata"), nil
}

// LoadAll reads every script of package tiers, from Dir.
func LoadAll() ([]*Script, error) {
	dir, err := Dir()
	if err != nil {
		return nil, err
	}
	return Load(dir)
}

// Load parses every dir/*.txt, in name order.
func Load(dir string) ([]*Script, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("tierstest: no scripts in %s", dir)
	}
	var out []*Script
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		s, err := Parse(f, fh)
		fh.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// Parse reads one script; file names it in errors and in the steps' Where.
func Parse(file string, r io.Reader) (*Script, error) {
	s := &Script{Name: strings.TrimSuffix(filepath.Base(file), ".txt"), Start: DefaultStart}
	p := &s.Policy
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		where := file + ":" + strconv.Itoa(line)
		text := sc.Text()
		if i := strings.Index(text, "#"); i >= 0 {
			text = text[:i]
		}
		w := strings.Fields(text)
		if len(w) == 0 {
			continue
		}
		ps := parser{where: where}
		kv := map[string]string{}
		for _, f := range w[1:] {
			k, v, _ := strings.Cut(f, "=")
			kv[k] = v
		}
		switch w[0] {
		case "tier":
			tr := tiers.Tier{Limit: ps.int(kv["limit"]), Window: ps.dur(kv["window"]), Active: ps.dur(kv["active"])}
			if c, ok := kv["cooldown"]; ok {
				tr.Cooldown = ps.dur(c)
			}
			_, tr.Skippable = kv["skippable"]
			p.Tiers = append(p.Tiers, tr)
		case "hard":
			p.HardLimit = ps.int(ps.arg(w, 1))
		case "global":
			p.GlobalLimit = ps.int(ps.arg(w, 1))
		case "bucket":
			p.Kind = tiers.KindTokenBucket
			p.Bucket = tiers.TokenBucket{Capacity: ps.int(kv["capacity"]), Refill: ps.int(kv["refill"]), Per: ps.dur(kv["per"])}
		case "concurrency":
			p.Kind, p.Concurrency = tiers.KindTiers, true
			p.Tiers = append(p.Tiers, tiers.Tier{Limit: ps.int(kv["limit"]), Window: ps.dur(kv["ttl"]), Active: tiers.Unbounded})
		case "fixed":
			u, ok := tiers.ParseUnit(kv["unit"])
			if !ok {
				ps.fail("unknown unit %q", kv["unit"])
			}
			p.Kind = tiers.KindFixedWindow
			p.Window = tiers.FixedWindow{Limit: ps.int(kv["limit"]), Unit: u}
		case "start":
			t, err := time.Parse(time.RFC3339Nano, ps.arg(w, 1))
			if err != nil {
				ps.fail("%v", err)
			}
			s.Start = t
		case "at":
			if err := tiers.Validate(p); err != nil {
				ps.fail("invalid policy: %v", err)
			}
			s.Steps = append(s.Steps, ps.step(s.Start, w))
		default:
			ps.fail("unknown line %q", w[0])
		}
		if ps.err != nil {
			return nil, ps.err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return s, nil
}

// parser keeps the first error of one line.
type parser struct {
	where string
	err   error
}

func (p *parser) fail(format string, args ...any) {
	if p.err == nil {
		p.err = fmt.Errorf("%s: %s", p.where, fmt.Sprintf(format, args...))
	}
}

func (p *parser) arg(w []string, i int) string {
	if i >= len(w) {
		p.fail("%s needs a value", w[i-1])
		return "0"
	}
	return w[i]
}

func (p *parser) int(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		p.fail("%v", err)
	}
	return n
}

func (p *parser) dur(s string) time.Duration {
	if s == "unbounded" {
		return tiers.Unbounded
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		p.fail("%v", err)
	}
	return d
}

// step parses "at D op N [min N] [as X] [-> expectations]".
func (p *parser) step(start time.Time, w []string) Step {
	st := Step{Where: p.where, At: start.Add(p.dur(p.arg(w, 1))), Domain: "a"}
	lhs, rhs, _ := strings.Cut(strings.Join(w[2:], " "), "->")
	args := strings.Fields(lhs)
	if len(args) < 2 {
		p.fail("want: at D request|refund|forget ARG")
		return st
	}
	for i := 2; i < len(args); i += 2 {
		switch args[i] {
		case "as":
			st.Domain = p.arg(args, i+1)
		case "min":
			st.Min = p.int(p.arg(args, i+1))
		case "slots":
			st.SlotsAt = start.Add(p.dur(p.arg(args, i+1)))
		default:
			p.fail("unknown argument %q", args[i])
		}
	}
	switch args[0] {
	case "request":
		st.Op, st.Copies = OpRequest, p.int(args[1])
		if st.Min == 0 {
			st.Min = st.Copies
		}
	case "refund":
		st.Op, st.Copies = OpRefund, p.int(args[1])
	case "forget":
		st.Op = OpForget
		switch args[1] {
		case "never":
			st.Forget = tiers.Forever
		case "none":
		default:
			st.Forget = start.Add(p.dur(args[1]))
		}
	default:
		p.fail("unknown step %q", args[0])
	}
	ex := strings.Fields(rhs)
	for i := 0; i < len(ex); i++ {
		e := expectation{key: ex[i]}
		switch {
		case e.key == "granted" || counts[e.key] != nil:
			i++
			e.n = p.int(p.arg(ex, i))
		case durations[e.key] != nil:
			i++
			e.d = p.dur(p.arg(ex, i))
		case slices.Contains([]string{"rejected", "burst", "noburst", "hard", "global"}, e.key):
		default:
			p.fail("unknown expectation %q", ex[i])
		}
		st.expect = append(st.expect, e)
	}
	if len(st.expect) > 0 && st.Op != OpRequest {
		p.fail("only a request has expectations")
	}
	return st
}

// counts are the expectations that compare a count of the decision with
// the number that follows them.
var counts = map[string]func(tiers.Decision) int64{
	"tier":      func(d tiers.Decision) int64 { return int64(d.Tier) },
	"hits":      func(d tiers.Decision) int64 { return d.TierHits },
	"remaining": func(d tiers.Decision) int64 { return d.Remaining },
	"domain":    func(d tiers.Decision) int64 { return d.DomainHits },
	"resource":  func(d tiers.Decision) int64 { return d.ResourceHits },
	"limit":     func(d tiers.Decision) int64 { return d.TierLimit },
}

// durations are the expectations that compare a duration of the decision
// with the one that follows them.
var durations = map[string]func(tiers.Decision) time.Duration{
	"window": func(d tiers.Decision) time.Duration { return d.TierWindow },
	"retry":  func(d tiers.Decision) time.Duration { return d.RetryAfter },
	"reset":  func(d tiers.Decision) time.Duration { return d.ResetAfter },
}

// Check returns one message per expectation of the step that d does not
// meet, "tier: got 1, want 2", or nil.
func (st *Step) Check(d tiers.Decision) []string {
	var bad []string
	for _, e := range st.expect {
		var got, want any
		ok := true
		if count := counts[e.key]; count != nil {
			got, want, ok = count(d), e.n, count(d) == e.n
		} else if dur := durations[e.key]; dur != nil {
			got, want, ok = dur(d), e.d, dur(d) == e.d
		}
		switch e.key {
		case "granted":
			got, want, ok = d.Granted, e.n, d.OK && d.Granted == e.n
			if !d.OK {
				got = "rejected"
			}
		case "rejected":
			got, want, ok = "granted", "rejected", !d.OK
		case "burst", "noburst":
			got, want, ok = d.Burst, e.key == "burst", d.Burst == (e.key == "burst")
		case "hard":
			got, want, ok = d.LimitedByHard, true, d.LimitedByHard
		case "global":
			got, want, ok = d.LimitedByGlobal, true, d.LimitedByGlobal
		}
		if !ok {
			bad = append(bad, fmt.Sprintf("%s: got %v, want %v", e.key, got, want))
		}
	}
	return bad
}
