package main

import (
	"github.com/charonlimit/charon/internal/copystore"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/store"
)

// newEngine builds the decision pipeline over st, with copies for the
// copy-limited resources.
func newEngine(c serveConfig, st store.Store, copies copystore.Store) *engine.Engine {
	return engine.New(engine.Options{Store: st, MaxDescriptors: c.MaxDescriptors, Copies: copies})
}
