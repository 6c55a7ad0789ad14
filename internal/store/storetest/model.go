package storetest

import (
	"context"
	"sync"
	"time"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/tiers"
)

// Model is the reference store: plain maps, one lock, store.Apply. It never
// forgets state and has no bound. The zero value is ready to use; safe for
// concurrent use.
type Model struct {
	mu      sync.Mutex
	states  map[store.Key]*tiers.State
	globals map[globalKey]*tiers.Global
	closed  bool
}

// globalKey is the resource whose global state it keys.
type globalKey string

var _ store.Store = (*Model)(nil)

// Decide implements store.Store.
func (m *Model) Decide(_ context.Context, now time.Time, items []store.Item, out []tiers.Decision) error {
	return m.decide(now, time.Time{}, items, out)
}

var _ store.Reserver = (*Model)(nil)

// Reserve implements store.Reserver: store.ApplyReserve.
func (m *Model) Reserve(_ context.Context, now time.Time, after time.Duration, items []store.Item, out []tiers.Decision) (time.Time, error) {
	at := now.Add(max(after, 0))
	return at, m.decide(now, at, items, out)
}

// GiveBack implements store.Reserver.
func (m *Model) GiveBack(_ context.Context, now, at time.Time, items []store.Item) error {
	back, out := store.GiveBackItems(items)
	return m.decide(now, at, back, out)
}

func (m *Model) decide(now, at time.Time, items []store.Item, out []tiers.Decision) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := store.CheckDecide(m.closed, items, out); err != nil {
		return err
	}
	if m.states == nil {
		m.states = make(map[store.Key]*tiers.State)
		m.globals = make(map[globalKey]*tiers.Global)
	}
	states := make([]*tiers.State, len(items))
	globals := make([]*tiers.Global, len(items))
	for i, it := range items {
		s, ok := m.states[it.Key]
		if !ok {
			s = new(tiers.State)
			m.states[it.Key] = s
		}
		states[i] = s
		if it.Policy.GlobalLimit > 0 {
			gk := globalKey(it.Key.Resource)
			g, ok := m.globals[gk]
			if !ok {
				g = new(tiers.Global)
				m.globals[gk] = g
			}
			globals[i] = g
		}
	}
	var plan store.Plan
	plan.Make(items)
	var err error
	if at.IsZero() {
		_, err = store.Apply(now, &plan, items, states, globals, out)
	} else {
		_, err = store.ApplyReserve(now, at, &plan, items, states, globals, out)
	}
	return err
}

// Close implements store.Store.
func (m *Model) Close() error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	return nil
}

var _ store.Inspector = (*Model)(nil)

// Inspect implements store.Inspector.
func (m *Model) Inspect(_ context.Context, now time.Time, it *store.Item) (tiers.View, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var g *tiers.Global
	if it.Policy.GlobalLimit > 0 {
		g = m.globals[globalKey(it.Key.Resource)]
		if g == nil {
			g = new(tiers.Global)
		}
	}
	return tiers.Inspect(it.Policy, m.states[it.Key], g, now), nil
}

// Reset implements store.Inspector.
func (m *Model) Reset(_ context.Context, it *store.Item) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.states, it.Key)
	return nil
}
