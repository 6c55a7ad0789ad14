package redisstore

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed decide.lua
var decideLua string

// The decide function is a Redis 7 function library (FUNCTION LOAD), named
// after a hash of its code so that processes of different versions sharing
// one Redis each call their own code. Redis runs the library's chunk once
// at load time, so a call pays for the decision only, not for defining the
// script's helpers as EVAL would on every call.
var (
	libVersion  = libHash(decideLua)
	libraryCode = strings.ReplaceAll(decideLua, "@V@", libVersion)
	libName     = "charon_" + libVersion
	funcName    = "charon_decide_" + libVersion
	// The command's first arguments, boxed once.
	fcallName   any = "fcall"
	funcNameArg any = funcName
)

func libHash(code string) string {
	h := sha1.Sum([]byte(code))
	return hex.EncodeToString(h[:8])
}

// isNotFound reports whether err is Redis' answer to an FCALL of a function
// it does not have: after a restart without persistence, a FUNCTION FLUSH,
// or on a node that never loaded it.
func isNotFound(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Function not found")
}

// Load loads the decide function into Redis (every master of a Cluster),
// replacing a library of the same name. Decide loads it by itself when
// Redis answers that it does not have it, so calling Load at start only
// moves that round trip out of the first request.
func (s *Store) Load(ctx context.Context) error {
	if cc, ok := s.c.(*redis.ClusterClient); ok {
		err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return m.FunctionLoadReplace(ctx, libraryCode).Err()
		})
		if err != nil {
			return fmt.Errorf("redisstore: FUNCTION LOAD: %w", err)
		}
		return nil
	}
	if err := s.c.FunctionLoadReplace(ctx, libraryCode).Err(); err != nil {
		return fmt.Errorf("redisstore: FUNCTION LOAD: %w", err)
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
	cmd := c.args
	res, err := s.c.Do(ctx, cmd...).Text()
	if isNotFound(err) {
		if err := s.Load(ctx); err != nil {
			return "", err
		}
		res, err = s.c.Do(ctx, cmd...).Text()
	}
	if err != nil {
		return "", fmt.Errorf("redisstore: %w", err)
	}
	return res, nil
}
