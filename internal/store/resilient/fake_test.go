package resilient_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/charonlimit/charon/internal/store"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/tiers"
)

var errRemote = errors.New("remote: connection refused")

// Behaviours of the fake remote.
const (
	answer   int32 = iota // decide from its memstore
	fail                  // return errRemote at once
	hang                  // block until the context is done
	gate                  // signal entered, wait for release, then answer
	notSent               // return store.ErrNotSent at once (queued past the deadline)
	gateFail              // signal entered, wait for release, then return errRemote
	stuck                 // return store.ErrNotSent with store.ErrStuck at once (queued behind unanswered calls)
)

// fakeRemote is a remote store whose behaviour, for decisions and pings
// alike, a test switches at will.
type fakeRemote struct {
	mem      *memstore.Store
	behavior atomic.Int32
	calls    atomic.Int64
	pings    atomic.Int64
	left     atomic.Int64 // ns: the last ping's time to its deadline
	closed   atomic.Bool
	entered  chan struct{}
	release  chan struct{}
	deadline atomic.Int64 // ns: the last call's context deadline, 0 for none
}

func newFake() *fakeRemote {
	return &fakeRemote{mem: memstore.New(memstore.Options{}), entered: make(chan struct{}, 1), release: make(chan struct{})}
}

func (f *fakeRemote) set(b int32) { f.behavior.Store(b) }

func (f *fakeRemote) Decide(ctx context.Context, now time.Time, items []store.Item, out []tiers.Decision) error {
	f.calls.Add(1)
	if d, ok := ctx.Deadline(); ok {
		f.deadline.Store(d.UnixNano())
	} else {
		f.deadline.Store(0)
	}
	if err := f.behave(ctx); err != nil {
		return err
	}
	return f.mem.Decide(ctx, now, items, out)
}

// Reserve and GiveBack make the fake a store.Reserver, behaving as
// Decide does.
func (f *fakeRemote) Reserve(ctx context.Context, now time.Time, after time.Duration, items []store.Item, out []tiers.Decision) (time.Time, error) {
	if err := f.behave(ctx); err != nil {
		return time.Time{}, err
	}
	return f.mem.Reserve(ctx, now, after, items, out)
}

func (f *fakeRemote) GiveBack(ctx context.Context, now, at time.Time, items []store.Item) error {
	if err := f.behave(ctx); err != nil {
		return err
	}
	return f.mem.GiveBack(ctx, now, at, items)
}

func (f *fakeRemote) Ping(ctx context.Context) error {
	f.pings.Add(1)
	if d, ok := ctx.Deadline(); ok {
		f.left.Store(int64(time.Until(d)))
	}
	return f.behave(ctx)
}

// behave fails, hangs or waits at the gate as the behaviour says.
func (f *fakeRemote) behave(ctx context.Context) error {
	switch b := f.behavior.Load(); b {
	case fail:
		return errRemote
	case notSent:
		return fmt.Errorf("remote: %w: %w", store.ErrNotSent, context.DeadlineExceeded)
	case stuck:
		return fmt.Errorf("remote: %w: %w: %w", store.ErrNotSent, store.ErrStuck, context.DeadlineExceeded)
	case hang:
		<-ctx.Done()
		return ctx.Err()
	case gate, gateFail:
		f.entered <- struct{}{}
		select {
		case <-f.release:
		case <-ctx.Done():
			return ctx.Err()
		}
		if b == gateFail {
			return errRemote
		}
	}
	return nil
}

func (f *fakeRemote) Close() error {
	f.closed.Store(true)
	return f.mem.Close()
}

// clock is an injected clock a test moves by hand.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := new(clock)
	c.ns.Store(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	return c
}

func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

func (f *fakeRemote) Inspect(ctx context.Context, now time.Time, it *store.Item) (tiers.View, error) {
	if err := f.behave(ctx); err != nil {
		return tiers.View{}, err
	}
	return f.mem.Inspect(ctx, now, it)
}

func (f *fakeRemote) Reset(ctx context.Context, it *store.Item) error {
	if err := f.behave(ctx); err != nil {
		return err
	}
	return f.mem.Reset(ctx, it)
}
