package engine

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/charonlimit/charon/descriptors"
	"github.com/charonlimit/charon/internal/store/memstore"
)

// requestTree has a rate-limited resource, an unlimited one, a
// copy-limited one (not Request's), a domain allowing unconfigured
// resources and one ignoring its limits.
func requestTree(t *testing.T) *descriptors.Tree {
	t.Helper()
	tree, err := descriptors.NewTree([]descriptors.DomainSpec{
		{Config: descriptors.DomainConfig{Name: "c"}, Nodes: []*descriptors.Node{
			{Key: "db", Limit: &descriptors.Limit{Copies: &descriptors.Copies{DomainLimit: 3}}},
			{Key: "rate", Limit: &descriptors.Limit{Policy: lyft(3, time.Second)}},
			{Key: "free", Limit: &descriptors.Limit{Unlimited: true}},
		}},
		{Config: descriptors.DomainConfig{Name: "open", AllowUnconfigured: true}},
		{Config: descriptors.DomainConfig{Name: "kill", IgnoreLimits: true}, Nodes: []*descriptors.Node{
			{Key: "rate", Limit: &descriptors.Limit{Policy: lyft(1, time.Second)}},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tree
}

func newRequestEngine(t *testing.T) (*Engine, *clock) {
	t.Helper()
	clk := newClock()
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { st.Close() })
	e := New(Options{Store: st, Now: clk.Now})
	e.SetTree(requestTree(t))
	return e, clk
}

func TestBulkRequest(t *testing.T) {
	e, clk := newRequestEngine(t)
	ctx := context.Background()
	r, err := e.Request(ctx, "c", entries("rate", "u"), 5, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Decision.OK || r.Decision.Granted != 3 || r.Match.Resource != "c/rate" || r.Match.Domain != "u" {
		t.Errorf("first request: got %+v", r)
	}
	r, err = e.Request(ctx, "c", entries("rate", "u"), 2, 1)
	if err != nil || r.Decision.OK || r.Decision.Granted != 0 || r.Decision.RetryAfter <= 0 {
		t.Errorf("second request: got %+v, %v; want a rejection with retry_after", r.Decision, err)
	}
	r, err = e.Request(ctx, "c", entries("rate", "u"), 2, 0)
	if err != nil || !r.Decision.OK || r.Decision.Granted != 0 {
		t.Errorf("min 0: got %+v, %v; want ok with 0 granted", r.Decision, err)
	}
	clk.Advance(time.Second)
	if r, _ = e.Request(ctx, "c", entries("rate", "u"), 1, 1); !r.Decision.OK {
		t.Errorf("after the window: got %+v, want granted", r.Decision)
	}
	if r, _ = e.Request(ctx, "c", entries("free", "u"), 7, 7); !r.Decision.OK || r.Decision.Granted != 7 || !r.Unlimited {
		t.Errorf("unlimited: got %+v", r)
	}
	if r, _ = e.Request(ctx, "open", entries("any", "u"), 7, 7); !r.Decision.OK || r.Decision.Granted != 7 || !r.Unlimited {
		t.Errorf("allow_unconfigured: got %+v", r)
	}
	if r, _ = e.Request(ctx, "kill", entries("rate", "u"), 9, 9); !r.Decision.OK || r.Decision.Granted != 9 || !r.Shadow {
		t.Errorf("ignore_limits: got %+v", r)
	}
}

func TestBulkRequestErrors(t *testing.T) {
	e, _ := newRequestEngine(t)
	fs := &fakeStore{err: errors.New("down")}
	down := New(Options{Store: fs})
	down.SetTree(requestTree(t))
	for _, tc := range []struct {
		name        string
		e           *Engine
		domain      string
		es          []descriptors.Entry
		copies, min int64
		want        error
		field       string
	}{
		{"empty domain", e, "", entries("rate", "u"), 1, 1, nil, "resource.domain"},
		{"no entries", e, "c", nil, 1, 1, nil, "resource.entries"},
		{"empty key", e, "c", entries("", "u"), 1, 1, nil, "resource.entries[0].key"},
		{"zero copies", e, "c", entries("rate", "u"), 0, 0, nil, "copies"},
		{"min above copies", e, "c", entries("rate", "u"), 1, 2, nil, "min_copies"},
		{"unknown resource", e, "c", entries("nope", "u"), 1, 1, descriptors.ErrUnknownResource, "resource"},
		{"unknown domain", e, "zz", entries("rate", "u"), 1, 1, descriptors.ErrUnknownResource, "resource"},
		{"copy-limited", e, "c", entries("db", "a"), 1, 1, ErrCopyLimited, "resource"},
		{"store down", down, "c", entries("rate", "u"), 1, 1, ErrStore, ""},
	} {
		_, err := tc.e.Request(context.Background(), tc.domain, tc.es, tc.copies, tc.min)
		wantFieldError(t, tc.name, err, tc.want, tc.field)
	}
}

// wantFieldError checks that err is not nil, matches want (when not nil)
// and names field (when not empty) as its prefix.
func wantFieldError(t *testing.T, name string, err, want error, field string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error", name)
		return
	}
	if want != nil && !errors.Is(err, want) {
		t.Errorf("%s: got %v, want %v", name, err, want)
	}
	if field != "" && !strings.HasPrefix(err.Error(), field+":") {
		t.Errorf("%s: error %q does not name field %q", name, err, field)
	}
}

// TestCopyLimitedRLS: a copy-limited resource is not rate limited: RLS
// cannot release a hold, so it answers OK, not limited.
func TestCopyLimitedRLS(t *testing.T) {
	e, _ := newRequestEngine(t)
	resp, err := e.ShouldRateLimit(context.Background(), &Request{Domain: "c", Descriptors: []Descriptor{desc("db", "a")}})
	if err != nil || resp.Code != CodeOK || resp.Statuses[0].Limit != nil {
		t.Errorf("RLS on a copy-limited resource: %+v, %v", resp, err)
	}
}
