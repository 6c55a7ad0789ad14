package copystoretest

import (
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/internal/copystore"
)

// The linearizability check: clients run random reserves (some replaying
// an earlier request id, some without a session), releases (some of more
// copies than held), transfers, seizes of each other's transfers (some of
// transfers already seized), keep-alives, and session deaths — their own,
// or another client's session ended under it — concurrently on one
// resource, at one fixed now (no lease lapses mid-history: lapses are
// tested sequentially). Porcupine then looks for an order of the
// operations, consistent with their real-time order, in which a sequential
// counting semaphore (linModel, written without copylog) answers exactly
// what the store answered: grants, rejections, tokens, counts and errors.

// linCfg is the resource's config: tight limits, so that clients compete.
var linCfg = abcConfig(3, 4, 2, 6)

type linKind uint8

const (
	linReserve linKind = iota
	linRelease
	linTransfer
	linSeize
	linKeepAlive
	linEndSession
)

var linKindNames = [...]string{"reserve", "release", "transfer", "seize", "keep-alive", "end-session"}

// linIn is an operation's input.
type linIn struct {
	kind                       linKind
	domain                     string
	copies, min                int64
	hold, request, session, id string // id: the transfer's
}

// linOut is an operation's output: the fields its kind answers.
type linOut struct {
	err               string
	ok, replayed      bool
	gone              bool
	hold              string
	granted, token    int64
	domainHeld, total int64
	copies, left      int64
	domain            string
	holds             int
}

type mHold struct {
	domain, session string
	copies          int64
}

type mRecord struct {
	hold, domain   string
	granted, token int64
}

// linState is the model's state; Step never modifies one, it makes the
// next.
type linState struct {
	holds     map[string]mHold
	transfers map[string]mHold
	records   map[string]mRecord
	token     int64
}

func (s *linState) clone() *linState {
	return &linState{holds: maps.Clone(s.holds), transfers: maps.Clone(s.transfers), records: maps.Clone(s.records), token: s.token}
}

// held returns the copies held and staged by domain d, in group ab, and in
// all.
func (s *linState) held(d string) (dom, ab, total int64) {
	count := func(h mHold) {
		total += h.copies
		if h.domain == d {
			dom += h.copies
		}
		if h.domain == "a" || h.domain == "b" {
			ab += h.copies
		}
	}
	for _, h := range s.holds {
		count(h)
	}
	for _, h := range s.transfers {
		count(h)
	}
	return dom, ab, total
}

// step is the sequential semaphore: the answer to in at s, and the next
// state.
func (s *linState) step(in linIn) (linOut, *linState) {
	switch in.kind {
	case linReserve:
		if in.request != "" {
			if rec, ok := s.records[in.request]; ok {
				if rec.domain != in.domain {
					return linOut{err: "request id reused"}, s
				}
				next := s
				if h, live := s.holds[rec.hold]; live && h.session != in.session {
					next = s.clone()
					h.session = in.session
					next.holds[rec.hold] = h
				}
				dom, _, total := next.held(in.domain)
				if _, live := next.holds[rec.hold]; !live {
					// The hold is gone: the replay says so and grants nothing.
					return linOut{replayed: true, gone: true, hold: rec.hold, token: rec.token, domainHeld: dom, total: total}, next
				}
				return linOut{ok: true, replayed: true, hold: rec.hold, granted: rec.granted, token: rec.token, domainHeld: dom, total: total}, next
			}
		}
		if _, dup := s.holds[in.hold]; dup {
			return linOut{err: "hold exists"}, s
		}
		dom, ab, total := s.held(in.domain)
		limit := linCfg.DomainLimit
		if v, ok := linCfg.Overrides[in.domain]; ok {
			limit = v
		}
		n := min(in.copies, limit-dom, linCfg.GlobalLimit-total)
		if in.domain == "a" || in.domain == "b" {
			n = min(n, linCfg.Groups[0].Limit-ab)
		}
		if n < max(in.min, 1) {
			return linOut{domainHeld: dom, total: total}, s
		}
		next := s.clone()
		next.token++
		next.holds[in.hold] = mHold{domain: in.domain, session: in.session, copies: n}
		if in.request != "" {
			next.records[in.request] = mRecord{hold: in.hold, domain: in.domain, granted: n, token: next.token}
		}
		return linOut{ok: true, hold: in.hold, granted: n, token: next.token, domainHeld: dom + n, total: total + n}, next
	case linRelease, linTransfer:
		h, ok := s.holds[in.hold]
		if !ok {
			return linOut{err: "unknown hold"}, s
		}
		if in.copies > h.copies {
			if in.kind == linRelease {
				return linOut{err: "over-release"}, s
			}
			return linOut{err: "over-transfer"}, s
		}
		n := in.copies
		if n == 0 {
			n = h.copies
		}
		next := s.clone()
		if h.copies -= n; h.copies == 0 {
			delete(next.holds, in.hold)
		} else {
			next.holds[in.hold] = h
		}
		if in.kind == linTransfer {
			next.transfers[in.id] = mHold{domain: h.domain, copies: n}
			return linOut{copies: n, left: h.copies}, next
		}
		dom, _, total := next.held(h.domain)
		return linOut{copies: n, left: h.copies, domain: h.domain, domainHeld: dom, total: total}, next
	case linSeize:
		x, ok := s.transfers[in.id]
		if !ok {
			return linOut{err: "unknown transfer"}, s
		}
		next := s.clone()
		delete(next.transfers, in.id)
		next.token++
		next.holds[in.hold] = mHold{domain: x.domain, session: in.session, copies: x.copies}
		return linOut{copies: x.copies, token: next.token, domain: x.domain}, next
	case linKeepAlive:
		n := 0
		for _, h := range s.holds {
			if h.session == in.session {
				n++
			}
		}
		return linOut{holds: n}, s
	case linEndSession:
		var out linOut
		next := s
		for id, h := range s.holds {
			if h.session != in.session {
				continue
			}
			if next == s {
				next = s.clone()
			}
			delete(next.holds, id)
			out.holds++
			out.copies += h.copies
		}
		return out, next
	}
	return linOut{err: "bad operation"}, s
}

// linModel is the sequential specification Porcupine checks against.
var linModel = porcupine.Model{
	Init: func() any {
		return &linState{holds: map[string]mHold{}, transfers: map[string]mHold{}, records: map[string]mRecord{}}
	},
	Step: func(state, input, output any) (bool, any) {
		want, next := state.(*linState).step(input.(linIn))
		return want == output.(linOut), next
	},
	Equal: func(a, b any) bool {
		x, y := a.(*linState), b.(*linState)
		return x.token == y.token && maps.Equal(x.holds, y.holds) && maps.Equal(x.transfers, y.transfers) && maps.Equal(x.records, y.records)
	},
	Hash: func(state any) uint64 {
		s := state.(*linState)
		h := fnv.New64a()
		fmt.Fprint(h, s.token, len(s.holds), len(s.transfers), len(s.records))
		var total int64
		for _, x := range s.holds {
			total += x.copies
		}
		fmt.Fprint(h, total)
		return h.Sum64()
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(linIn), output.(linOut)
		return fmt.Sprintf("%s%+v -> %+v", linKindNames[in.kind], in, out)
	},
	DescribeState: func(state any) string {
		s := state.(*linState)
		var b strings.Builder
		fmt.Fprintf(&b, "token %d;", s.token)
		ids := make([]string, 0, len(s.holds))
		for id := range s.holds {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			h := s.holds[id]
			fmt.Fprintf(&b, " %s:%s×%d@%s", id, h.domain, h.copies, h.session)
		}
		for id, x := range s.transfers {
			fmt.Fprintf(&b, " staged %s:%s×%d", id, x.domain, x.copies)
		}
		return b.String()
	},
}

// linRecorder collects one history.
type linRecorder struct {
	clock atomic.Int64
	mu    sync.Mutex
	ops   []porcupine.Operation
	// transfers are the ids of every transfer made, seized or not.
	transfers []string
	// sessions are the clients' current sessions.
	sessions []string
	// step starts the clients' operations together, one at a time each,
	// so that even a store answering in a microsecond sees them overlap.
	step *barrier
}

// barrier is a cyclic barrier of n goroutines.
type barrier struct {
	mu         sync.Mutex
	cond       sync.Cond
	n, waiting int
	generation int
}

func newBarrier(n int) *barrier {
	b := &barrier{n: n}
	b.cond.L = &b.mu
	return b
}

// wait returns when all n goroutines called it.
func (b *barrier) wait() {
	b.mu.Lock()
	defer b.mu.Unlock()
	gen := b.generation
	if b.waiting++; b.waiting == b.n {
		b.waiting = 0
		b.generation++
		b.cond.Broadcast()
		return
	}
	for gen == b.generation {
		b.cond.Wait()
	}
}

// do runs op as client c and records it.
func (r *linRecorder) do(c int, in linIn, op func() linOut) linOut {
	call := r.clock.Add(1)
	out := op()
	ret := r.clock.Add(1)
	r.mu.Lock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret})
	r.mu.Unlock()
	return out
}

func (r *linRecorder) pick(rng *rand.Rand, list *[]string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(*list) == 0 {
		return ""
	}
	return (*list)[rng.IntN(len(*list))]
}

// linHistory runs clients clients of linOps operations each on a fresh
// resource of s and returns the history.
func linHistory(s copystore.Store, seed uint64, clients int) []porcupine.Operation {
	res := Resource("lin")
	rec := &linRecorder{sessions: make([]string, clients)}
	for c := range clients {
		rec.sessions[c] = newID("s")
	}
	rec.step = newBarrier(clients)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() { linClient(s, res, rec, c, rand.New(rand.NewPCG(seed, uint64(c)))) })
	}
	wg.Wait()
	return rec.ops
}

// linOps is the number of operations per client.
const linOps = 30

func linClient(s copystore.Store, res string, rec *linRecorder, c int, rng *rand.Rand) {
	type known struct {
		id     string
		copies int64
	}
	var holds []known
	type request struct{ id, domain string }
	var requests []request
	session := func() string {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return rec.sessions[c]
	}
	for range linOps {
		rec.step.wait()
		op := rng.IntN(100)
		if len(holds) == 0 && op >= 35 && op < 65 {
			op = 0 // nothing to release or transfer: reserve
		}
		switch {
		case op < 35:
			in := linIn{kind: linReserve, domain: concDomains[rng.IntN(len(concDomains))], copies: int64(1 + rng.IntN(3)), hold: newID("h"), session: session()}
			in.min = int64(rng.IntN(int(in.copies) + 1))
			switch r := rng.IntN(10); {
			case r < 3 && len(requests) > 0:
				q := requests[rng.IntN(len(requests))]
				in.request, in.domain = q.id, q.domain
				if r == 0 {
					in.domain = "c" // reused for c: an error unless q was c's
				}
			case r < 7:
				in.request = newID("q")
			}
			if rng.IntN(5) == 0 {
				in.session = ""
			}
			out := rec.do(c, in, func() linOut {
				got, err := s.Reserve(ctx, T0, res, linCfg, copylog.ReserveRequest{Domain: in.domain, Copies: in.copies, Min: in.min,
					HoldID: in.hold, RequestID: in.request, Session: in.session, Lease: Lease})
				if err != nil {
					return linOut{err: errKind(err)}
				}
				return linOut{ok: got.OK, replayed: got.Replayed, gone: got.HoldGone, hold: got.HoldID, granted: got.Granted, token: got.Token,
					domainHeld: got.Context.DomainHeld, total: got.Context.TotalHeld}
			})
			if out.ok && !out.replayed {
				holds = append(holds, known{out.hold, out.granted})
				if in.request != "" {
					requests = append(requests, request{in.request, in.domain})
				}
			}
		case op < 55:
			i := rng.IntN(len(holds))
			in := linIn{kind: linRelease, hold: holds[i].id, copies: int64(rng.IntN(int(holds[i].copies) + 2))}
			out := rec.do(c, in, func() linOut {
				got, err := s.Release(ctx, T0, res, in.hold, in.copies)
				if err != nil {
					return linOut{err: errKind(err)}
				}
				return linOut{copies: got.Released, left: got.Left, domain: got.Domain, domainHeld: got.DomainHeld, total: got.TotalHeld}
			})
			if out.err == "" && out.left > 0 {
				holds[i].copies = out.left
			} else if out.err != "over-release" {
				holds = append(holds[:i], holds[i+1:]...)
			}
		case op < 65:
			i := rng.IntN(len(holds))
			in := linIn{kind: linTransfer, hold: holds[i].id, copies: int64(rng.IntN(int(holds[i].copies) + 2)), id: newID("x")}
			out := rec.do(c, in, func() linOut {
				got, err := s.Transfer(ctx, T0, res, in.hold, in.copies, Lease, in.id)
				if err != nil {
					return linOut{err: errKind(err)}
				}
				return linOut{copies: got.Copies, left: got.Left}
			})
			if out.err == "" {
				rec.mu.Lock()
				rec.transfers = append(rec.transfers, in.id)
				rec.mu.Unlock()
			}
			if out.err == "" && out.left > 0 {
				holds[i].copies = out.left
			} else if out.err != "over-transfer" {
				holds = append(holds[:i], holds[i+1:]...)
			}
		case op < 80:
			x := rec.pick(rng, &rec.transfers)
			if x == "" {
				continue
			}
			in := linIn{kind: linSeize, id: x, hold: newID("h"), session: session()}
			out := rec.do(c, in, func() linOut {
				got, err := s.Seize(ctx, T0, res, in.id, in.hold, in.session, Lease)
				if err != nil {
					return linOut{err: errKind(err)}
				}
				return linOut{copies: got.Copies, token: got.Token, domain: got.Domain}
			})
			if out.err == "" {
				holds = append(holds, known{in.hold, out.copies})
			}
		case op < 85:
			in := linIn{kind: linKeepAlive, session: session()}
			rec.do(c, in, func() linOut {
				got, err := s.KeepAlive(ctx, T0, res, in.session, "", Lease)
				if err != nil {
					return linOut{err: errKind(err)}
				}
				return linOut{holds: got.Holds}
			})
		default:
			// op < 92: this client's session ends and it opens another;
			// else another client's session ends under it.
			victim := c
			if op >= 92 {
				victim = rng.IntN(len(rec.sessions))
			}
			rec.mu.Lock()
			in := linIn{kind: linEndSession, session: rec.sessions[victim]}
			rec.mu.Unlock()
			rec.do(c, in, func() linOut {
				got, err := s.ReleaseSession(ctx, T0, res, in.session)
				if err != nil {
					return linOut{err: errKind(err)}
				}
				return linOut{holds: got.Holds, copies: got.Copies}
			})
			if victim == c {
				rec.mu.Lock()
				rec.sessions[c] = newID("s")
				rec.mu.Unlock()
			}
		}
	}
}

// checkLinearizable checks one history and describes a failure ("" when
// the history is linearizable), with a visualization file when visualize
// is set.
func checkLinearizable(history []porcupine.Operation, timeout time.Duration, visualize bool) string {
	for _, op := range history {
		if out := op.Output.(linOut); strings.HasPrefix(out.err, "other: ") {
			return fmt.Sprintf("unexpected error in %s: %s", linKindNames[op.Input.(linIn).kind], out.err)
		}
	}
	res, info := porcupine.CheckOperationsVerbose(linModel, history, timeout)
	switch res {
	case porcupine.Ok:
		return ""
	case porcupine.Unknown:
		return fmt.Sprintf("the check of %d operations did not finish within %v", len(history), timeout)
	}
	msg := fmt.Sprintf("history of %d operations is not linearizable", len(history))
	if !visualize {
		return msg
	}
	if f, err := os.CreateTemp("", "copystore-linearizability-*.html"); err == nil {
		if porcupine.Visualize(linModel, info, f) == nil {
			msg += "; visualization in " + f.Name()
		}
		f.Close()
	}
	return msg
}

// linRounds is the number of histories checked.
const linRounds = 16

func testLinearizable(t *testing.T, s copystore.Store) {
	kinds := map[string]int{}
	for round := range linRounds {
		history := linHistory(s, uint64(round), 5)
		for _, op := range history {
			in, out := op.Input.(linIn), op.Output.(linOut)
			k := linKindNames[in.kind]
			switch {
			case out.err != "":
				k += " error " + out.err
			case in.kind == linReserve && out.replayed:
				k += " replayed"
			case in.kind == linReserve && !out.ok:
				k += " rejected"
			}
			kinds[k]++
		}
		if msg := checkLinearizable(history, 30*time.Second, true); msg != "" {
			t.Fatalf("round %d: %s", round, msg)
		}
	}
	// The histories must have exercised every kind of outcome.
	for _, k := range []string{"reserve", "reserve rejected", "reserve replayed", "reserve error request id reused",
		"release", "release error over-release", "release error unknown hold", "transfer", "seize",
		"seize error unknown transfer", "keep-alive", "end-session"} {
		if kinds[k] == 0 {
			t.Errorf("no %q in the histories: %v", k, kinds)
		}
	}
}
