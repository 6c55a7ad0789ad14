package redisstore

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/charonlimit/charon/internal/redisfunc"
)

// The decide library's code is in five files, split where the Go code it
// ports splits: tiers.lua (package tiers: hit logs, phases, decide, refund
// and forget per algorithm), pace.lua (its reservations, tiers/reserve.go),
// state.lua (the stored forms of policies and
// states, load and save), fastpaths.lua (the general code written out for
// common calls) and apply.lua (store.Apply over a call's items, the lock
// modes, the replies, the batch function). They are one Lua chunk,
// concatenated in that order after the "#!lua" line: each file uses only
// what the files before it define, and the library's hash covers them all.
var (
	//go:embed tiers.lua
	tiersLua string
	//go:embed pace.lua
	paceLua string
	//go:embed state.lua
	stateLua string
	//go:embed fastpaths.lua
	fastpathsLua string
	//go:embed apply.lua
	applyLua string

	// decideLua is the library's code as written (with redisfunc's
	// Placeholder).
	decideLua = "#!lua name=charon_" + redisfunc.Placeholder + "\n" + tiersLua + paceLua + stateLua + fastpathsLua + applyLua
)

// The decide function is a Redis 7 function library (FUNCTION LOAD), named
// after a hash of its code so that processes of different versions sharing
// one Redis each call their own code. Redis runs the library's chunk once
// at load time, so a call pays for the decision only, not for defining the
// script's helpers as EVAL would on every call.
var (
	lib         = redisfunc.New(decideLua)
	libraryCode = lib.Code
	funcName    = lib.Function("charon_decide_")
	batchName   = lib.Function("charon_batch_")
	xbatchName  = lib.Function("charon_xbatch_")
	// The command's first arguments, boxed once.
	fcallName    any = "fcall"
	funcNameArg  any = funcName
	batchNameArg any = batchName
	xbatchArg    any = xbatchName
	// libHash is the version a library's code gets.
	libHash = redisfunc.Hash
)

// Load loads the decide function into Redis (every master of a Cluster),
// replacing a library of the same name. Decide loads it by itself when
// Redis answers that it does not have it, so calling Load at start only
// moves that round trip out of the first request.
func (s *Store) Load(ctx context.Context) error {
	if err := lib.Load(ctx, s.c); err != nil {
		return fmt.Errorf("redisstore: %w", err)
	}
	return nil
}

// fcall sends c.args, an FCALL of the decide function (fcallName,
// funcNameArg, the number of keys, the keys, the arguments), through the
// dispatchers' pipelines (pipeline.go), or on its own when they are off,
// loading the function first when Redis does not have it (then sending
// the command again: the function did not run).
func (s *Store) fcall(ctx context.Context, c *call) (string, error) {
	if s.q != nil {
		return s.send(ctx, c)
	}
	var res string
	err := lib.Run(ctx, s.c, func() (err error) {
		res, err = s.c.Do(ctx, c.args...).Text()
		return err
	})
	if err != nil {
		return "", wrapReply(err)
	}
	return res, nil
}
