package copystoretest

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/charonlimit/charon/copylog"
	"github.com/charonlimit/charon/internal/copystore"
	"github.com/charonlimit/charon/internal/copystore/memcopy"
)

// deafSessions forgets to release the holds of an ended session.
type deafSessions struct{ copystore.Store }

func (deafSessions) ReleaseSession(context.Context, time.Time, string, string) (copylog.SessionResult, error) {
	return copylog.SessionResult{}, nil
}

// doubleSeize lets a transfer be seized twice: the second seize answers the
// first one's grant.
type doubleSeize struct {
	copystore.Store
	mu     sync.Mutex
	seized map[string]copylog.SeizeResult
}

func (d *doubleSeize) Seize(ctx context.Context, now time.Time, res, x, hold, session string, lease time.Duration) (copylog.SeizeResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r, ok := d.seized[x]; ok {
		r.HoldID = hold
		return r, nil
	}
	r, err := d.Store.Seize(ctx, now, res, x, hold, session, lease)
	if err == nil {
		d.seized[x] = r
	}
	return r, err
}

// The check finds the bugs of broken stores, and passes memcopy.
func TestLinearizabilityCheckFindsBugs(t *testing.T) {
	stores := []struct {
		name   string
		broken bool
		make   func() copystore.Store
	}{
		{"memcopy", false, func() copystore.Store { return memcopy.New(memcopy.Options{}) }},
		{"deaf sessions", true, func() copystore.Store { return deafSessions{memcopy.New(memcopy.Options{})} }},
		{"double seize", true, func() copystore.Store {
			return &doubleSeize{Store: memcopy.New(memcopy.Options{}), seized: map[string]copylog.SeizeResult{}}
		}},
	}
	for _, st := range stores {
		s := st.make()
		failures := 0
		for round := range 4 {
			msg := checkLinearizable(linHistory(s, uint64(100+round), 5), 30*time.Second, false)
			if msg != "" && !strings.Contains(msg, "not linearizable") {
				t.Fatalf("%s: %s", st.name, msg)
			}
			if msg != "" {
				failures++
			}
		}
		s.Close()
		if st.broken && failures == 0 {
			t.Errorf("%s: 4 histories passed the check", st.name)
		}
		if !st.broken && failures > 0 {
			t.Errorf("%s: %d of 4 histories failed the check", st.name, failures)
		}
	}
}

// A hand-made history that a semaphore cannot produce: two overlapping
// reserves both granted the whole limit.
func TestLinearizabilityModelRejectsOvergrant(t *testing.T) {
	s := memcopy.New(memcopy.Options{})
	defer s.Close()
	h := linHistory(s, 7, 1)
	if msg := checkLinearizable(h, 10*time.Second, false); msg != "" {
		t.Fatalf("a sequential history of memcopy: %s", msg)
	}
	ops := h[:0:0]
	for i, hold := range []string{"h1", "h2"} {
		ops = append(ops, linOp(i, linIn{kind: linReserve, domain: "c", copies: 2, min: 2, hold: hold},
			linOut{ok: true, hold: hold, granted: 2, token: int64(i + 1), domainHeld: 2, total: 2}, 0, 10))
	}
	if msg := checkLinearizable(ops, 10*time.Second, false); !strings.Contains(msg, "not linearizable") {
		t.Errorf("two grants of c's whole limit: %q, want not linearizable", msg)
	}
}

func linOp(client int, in linIn, out linOut, call, ret int64) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret}
}
