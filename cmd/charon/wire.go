package main

import (
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/store"
)

// newEngine builds the decision pipeline over st.
func newEngine(c serveConfig, st store.Store) *engine.Engine {
	return engine.New(engine.Options{Store: st, MaxDescriptors: c.MaxDescriptors})
}
