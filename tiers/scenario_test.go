package tiers

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Scenario scripts in testdata/*.txt. Config lines come first:
//
//	tier limit=5 window=1s active=unbounded cooldown=15s skippable
//	hard 10
//	global 20
//	bucket capacity=10 refill=1 per=1s
//	fixed limit=5 unit=minute
//	start 2024-05-01T12:00:00Z        (the instant "at 0s" names; default t0)
//
// then steps, times relative to the start, for domain "a" unless "as X":
//
//	at 1.5s request 3 [min 2] [as b] -> granted 3 tier 1 [hits 3] [remaining 2] [burst|noburst]
//	at 2s request 1 -> rejected [tier 1] [retry 500ms] [hard] [global]
//	at 3s refund 2 [as b]
//	at 3s forget 20s                  (ForgetAt of the domain, relative to start; "never"; "none")
//
// Other expectation keys: domain N, resource N, reset D, limit N, window D.
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScenario(t, f) })
	}
}

func parseDur(t *testing.T, where, s string) time.Duration {
	t.Helper()
	if s == "unbounded" {
		return Unbounded
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	return d
}

func parseInt(t *testing.T, where, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	return n
}

func runScenario(t *testing.T, file string) {
	fh, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	p := &Policy{}
	start := t0
	states := map[string]*State{}
	g := &Global{}
	sc := bufio.NewScanner(fh)
	line := 0
	for sc.Scan() {
		line++
		where := file + ":" + strconv.Itoa(line)
		text := strings.TrimSpace(sc.Text())
		if i := strings.Index(text, "#"); i >= 0 {
			text = strings.TrimSpace(text[:i])
		}
		if text == "" {
			continue
		}
		w := strings.Fields(text)
		kv := func() map[string]string {
			m := map[string]string{}
			for _, f := range w[1:] {
				k, v, _ := strings.Cut(f, "=")
				m[k] = v
			}
			return m
		}
		switch w[0] {
		case "tier":
			m := kv()
			tr := Tier{Limit: parseInt(t, where, m["limit"]), Window: parseDur(t, where, m["window"]), Active: parseDur(t, where, m["active"])}
			if c, ok := m["cooldown"]; ok {
				tr.Cooldown = parseDur(t, where, c)
			}
			_, tr.Skippable = m["skippable"]
			p.Tiers = append(p.Tiers, tr)
		case "hard":
			p.HardLimit = parseInt(t, where, w[1])
		case "global":
			p.GlobalLimit = parseInt(t, where, w[1])
		case "bucket":
			m := kv()
			p.Kind = KindTokenBucket
			p.Bucket = TokenBucket{Capacity: parseInt(t, where, m["capacity"]), Refill: parseInt(t, where, m["refill"]), Per: parseDur(t, where, m["per"])}
		case "fixed":
			m := kv()
			p.Kind = KindFixedWindow
			units := map[string]Unit{"second": UnitSecond, "minute": UnitMinute, "hour": UnitHour, "day": UnitDay, "week": UnitWeek, "month": UnitMonth, "year": UnitYear}
			p.Window = FixedWindow{Limit: parseInt(t, where, m["limit"]), Unit: units[m["unit"]]}
		case "start":
			start, err = time.Parse(time.RFC3339Nano, w[1])
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
		case "at":
			if err := Validate(p); err != nil {
				t.Fatalf("%s: invalid policy: %v", where, err)
			}
			now := start.Add(parseDur(t, where, w[1]))
			lhs, rhs, _ := strings.Cut(strings.Join(w[2:], " "), "->")
			args := strings.Fields(lhs)
			dom := "a"
			var copies, min int64
			for i := 2; i+1 < len(args); i += 2 {
				switch args[i] {
				case "as":
					dom = args[i+1]
				case "min":
					min = parseInt(t, where, args[i+1])
				}
			}
			s := states[dom]
			if s == nil {
				s = &State{}
				states[dom] = s
			}
			switch args[0] {
			case "refund":
				Refund(p, s, g, now, parseInt(t, where, args[1]))
				continue
			case "forget":
				got := ForgetAt(p, s)
				var want time.Time
				switch args[1] {
				case "never":
					want = Forever
				case "none":
				default:
					want = start.Add(parseDur(t, where, args[1]))
				}
				if !got.Equal(want) {
					t.Errorf("%s: ForgetAt = %v, want %v", where, got, want)
				}
				continue
			case "request":
			default:
				t.Fatalf("%s: unknown step %q", where, args[0])
			}
			copies = parseInt(t, where, args[1])
			if min == 0 {
				min = copies
			}
			peek := Peek(p, s, g, now, copies, min)
			d := Request(p, s, g, now, copies, min)
			if peek != d {
				t.Fatalf("%s: Peek %+v, Request %+v", where, peek, d)
			}
			checkExpect(t, where, d, strings.Fields(rhs))
		default:
			t.Fatalf("%s: unknown line %q", where, w[0])
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}

func checkExpect(t *testing.T, where string, d Decision, ex []string) {
	t.Helper()
	num := func(i int) int64 {
		if i+1 >= len(ex) {
			t.Fatalf("%s: %s needs a value", where, ex[i])
		}
		return parseInt(t, where, ex[i+1])
	}
	dur := func(i int) time.Duration {
		if i+1 >= len(ex) {
			t.Fatalf("%s: %s needs a value", where, ex[i])
		}
		return parseDur(t, where, ex[i+1])
	}
	for i := 0; i < len(ex); i++ {
		var bad bool
		var want any
		var got any
		switch ex[i] {
		case "granted":
			want, got = num(i), d.Granted
			bad = !d.OK || d.Granted != num(i)
			i++
		case "rejected":
			want, got, bad = "rejected", d, d.OK
		case "tier":
			want, got = num(i), int64(d.Tier)
			bad = int64(d.Tier) != num(i)
			i++
		case "hits":
			want, got, bad = num(i), d.TierHits, d.TierHits != num(i)
			i++
		case "remaining":
			want, got, bad = num(i), d.Remaining, d.Remaining != num(i)
			i++
		case "domain":
			want, got, bad = num(i), d.DomainHits, d.DomainHits != num(i)
			i++
		case "resource":
			want, got, bad = num(i), d.ResourceHits, d.ResourceHits != num(i)
			i++
		case "limit":
			want, got, bad = num(i), d.TierLimit, d.TierLimit != num(i)
			i++
		case "window":
			want, got, bad = dur(i), d.TierWindow, d.TierWindow != dur(i)
			i++
		case "retry":
			want, got, bad = dur(i), d.RetryAfter, d.RetryAfter != dur(i)
			i++
		case "reset":
			want, got, bad = dur(i), d.ResetAfter, d.ResetAfter != dur(i)
			i++
		case "burst":
			want, got, bad = true, d.Burst, !d.Burst
		case "noburst":
			want, got, bad = false, d.Burst, d.Burst
		case "hard":
			want, got, bad = true, d.LimitedByHard, !d.LimitedByHard
		case "global":
			want, got, bad = true, d.LimitedByGlobal, !d.LimitedByGlobal
		default:
			t.Fatalf("%s: unknown expectation %q", where, ex[i])
		}
		if bad {
			t.Errorf("%s: %s: got %v, want %v (decision %+v)", where, ex[i], got, want, d)
		}
	}
}
