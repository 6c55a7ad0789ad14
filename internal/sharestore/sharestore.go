// Package sharestore is the contract of the stores that keep the leases of
// the Rate Limit Quota Service: per budget (one rule's limit, for one
// Charon domain), the share each Envoy stream holds and until when. The
// allocation itself is fairshare.Allocate, run by the store on the budget's
// records atomically, so that replicas sharing a store never hand out more
// than the budget in total.
package sharestore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/charonlimit/charon/fairshare"
)

// ErrUnavailable wraps every failure of the store itself.
var ErrUnavailable = errors.New("sharestore: unavailable")

// Budget is one rule's limit for one Charon domain: Limit tokens per fill
// interval. Key is a stable identity (the resource, the policy ID and the
// domain, escaped as descriptors.Match does: no ':', '{' or '}').
type Budget struct {
	Key   string
	Limit int64
}

// Demand is the claim of one instance the caller serves.
type Demand struct {
	ID     string
	Demand int64 // tokens per fill interval, or fairshare.Unknown
}

// Store keeps the leases of budgets' shares.
//
// Allocate runs fairshare.Allocate at now (a Redis store uses Redis TIME
// instead) over the budget's records, the instances in mine being Mine,
// with tolerance; records their demands, new shares and leases until now+ttl;
// forgets the records whose leases have expired; and returns the new shares
// in the order of mine. The records of instances the caller no longer lists
// stay, counted, until their leases expire: that is how a lost stream's
// share is reclaimed, and never sooner. A failure of the store wraps
// ErrUnavailable, and changes nothing the caller can rely on.
//
// Implementations are safe for concurrent use.
type Store interface {
	Allocate(ctx context.Context, now time.Time, b Budget, mine []Demand, ttl time.Duration, tolerance float64) ([]int64, error)
}

// Renewer is a Store that can extend the leases of the caller's instances
// at the shares they hold, without splitting the budget again, when nothing
// but the passing of time has changed it since the caller's last Allocate:
// the caller lists the same instances with the demands it passed then.
//
// Renew returns the shares held, in the order of mine, and ok true, having
// extended their leases until now+ttl; or ok false, changing nothing, when
// the budget holds anything else (another instance's lease, live or
// expired; a missing or expired lease of mine; another demand or limit):
// then the caller runs Allocate. Since the shares held are those of an
// Allocate over exactly these instances and this limit, they still sum to at
// most the limit.
type Renewer interface {
	Renew(ctx context.Context, now time.Time, b Budget, mine []Demand, ttl time.Duration) (shares []int64, ok bool, err error)
}

// Memory is a Store of one process. The zero value is ready; safe for
// concurrent use.
type Memory struct {
	mu      sync.Mutex
	budgets map[string]*memBudget
}

// memBudget is a budget's records and the limit of its last allocation.
// settled is set when that allocation's records were all its caller's, and
// cleared when a record expires or another caller allocates: Renew only
// renews a settled budget, so room freed since the split is split again.
type memBudget struct {
	limit   int64
	recs    map[string]record
	settled bool
}

type record struct {
	demand, held int64
	expires      time.Time
}

// Allocate implements Store.
func (m *Memory) Allocate(_ context.Context, now time.Time, b Budget, mine []Demand, ttl time.Duration, tolerance float64) ([]int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.budgets == nil {
		m.budgets = map[string]*memBudget{}
	}
	mb := m.budgets[b.Key]
	if mb == nil {
		mb = &memBudget{recs: map[string]record{}}
		m.budgets[b.Key] = mb
	}
	mb.limit = b.Limit
	recs := mb.recs
	shares := Run(now, b.Limit, recs2claims(recs), mine, tolerance)
	for id, r := range recs {
		if !now.Before(r.expires) {
			delete(recs, id)
		}
	}
	for i, d := range mine {
		recs[d.ID] = record{demand: d.Demand, held: shares[i], expires: now.Add(ttl)}
	}
	mb.settled = len(recs) == len(mine)
	if len(recs) == 0 {
		delete(m.budgets, b.Key)
	}
	return shares, nil
}

// Renew implements Renewer: it checks every record before it extends any,
// so a refusal changes nothing.
func (m *Memory) Renew(_ context.Context, now time.Time, b Budget, mine []Demand, ttl time.Duration) ([]int64, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mb := m.budgets[b.Key]
	if mb == nil || !mb.settled || mb.limit != b.Limit || len(mb.recs) != len(mine) {
		return nil, false, nil
	}
	shares := make([]int64, len(mine))
	for i, d := range mine {
		r, ok := mb.recs[d.ID]
		if !ok || r.demand != d.Demand || !now.Before(r.expires) {
			return nil, false, nil
		}
		shares[i] = r.held
	}
	// len(recs) == len(mine) and every ID of mine has a record: the records
	// are exactly mine (IDs are unique within a budget).
	exp := now.Add(ttl)
	for _, d := range mine {
		r := mb.recs[d.ID]
		r.expires = exp
		mb.recs[d.ID] = r
	}
	return shares, true, nil
}

// Sweep forgets the expired leases of every budget, and the budgets left
// with none: those no caller allocates any more (a Charon domain whose
// Envoys went away) would otherwise stay. The allocator calls it every tick.
func (m *Memory) Sweep(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for key, mb := range m.budgets {
		recs := mb.recs
		for id, r := range recs {
			if !now.Before(r.expires) {
				delete(recs, id)
				mb.settled = false
			}
		}
		if len(recs) == 0 {
			delete(m.budgets, key)
		}
	}
}

// Len returns the number of budgets with records (for tests and metrics).
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.budgets)
}

func recs2claims(recs map[string]record) []fairshare.Claim {
	cs := make([]fairshare.Claim, 0, len(recs))
	for id, r := range recs {
		cs = append(cs, fairshare.Claim{ID: id, Demand: r.demand, Held: r.held, Expires: r.expires})
	}
	return cs
}

// Run is the allocation every store runs on a budget's records (others,
// Mine unset, in any order): the instances of mine replace their own
// records and are allocated to. It returns the shares of mine, in order.
func Run(now time.Time, limit int64, others []fairshare.Claim, mine []Demand, tolerance float64) []int64 {
	held := make(map[string]fairshare.Claim, len(others))
	for _, c := range others {
		held[c.ID] = c
	}
	claims := make([]fairshare.Claim, 0, len(others)+len(mine))
	for _, d := range mine {
		c := held[d.ID]
		delete(held, d.ID)
		claims = append(claims, fairshare.Claim{ID: d.ID, Demand: d.Demand, Held: c.Held, Expires: c.Expires, Mine: true})
	}
	for _, c := range others {
		if _, ok := held[c.ID]; ok {
			claims = append(claims, c)
		}
	}
	return fairshare.Allocate(limit, claims, now, tolerance)[:len(mine)]
}
