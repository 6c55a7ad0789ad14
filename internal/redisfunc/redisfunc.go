package redisfunc

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Placeholder is replaced by the library's version everywhere in its code:
// in the library's name (the "#!lua name=" line) and in its functions'.
const Placeholder = "@V@"

// Library is a Redis function library whose name and functions carry a hash
// of its code. Immutable after New; safe for concurrent use.
type Library struct {
	// Version is the hex hash of the code as written (with Placeholder).
	Version string
	// Code is the code with Placeholder replaced by Version: what FUNCTION
	// LOAD receives.
	Code string
	// Name is the library's name, from Code's "#!lua name=" first line.
	Name string
}

// New returns the library of code, which starts, as FUNCTION LOAD wants,
// with a "#!lua name=..." line; every Placeholder in it becomes the
// library's version.
func New(code string) *Library {
	v := Hash(code)
	l := &Library{Version: v, Code: strings.ReplaceAll(code, Placeholder, v)}
	first, _, _ := strings.Cut(l.Code, "\n")
	if _, name, ok := strings.Cut(first, "name="); ok {
		l.Name, _, _ = strings.Cut(name, " ")
	}
	return l
}

// Hash is the version New gives code: 16 hex digits of its SHA-1.
func Hash(code string) string {
	h := sha1.Sum([]byte(code))
	return hex.EncodeToString(h[:8])
}

// Function is the name of the library's function named prefix, followed by
// the version: what FCALL names.
func (l *Library) Function(prefix string) string { return prefix + l.Version }

// IsNotFound reports whether err is Redis' answer to an FCALL of a function
// it does not have.
func IsNotFound(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Function not found")
}

// Load loads the library with FUNCTION LOAD REPLACE on every master of c
// (c itself unless it is a *redis.ClusterClient), replacing a library of the
// same name.
func (l *Library) Load(ctx context.Context, c redis.UniversalClient) error {
	err := EachMaster(ctx, c, func(ctx context.Context, m redis.UniversalClient) error {
		return m.FunctionLoadReplace(ctx, l.Code).Err()
	})
	if err != nil {
		return fmt.Errorf("FUNCTION LOAD %s: %w", l.Name, err)
	}
	return nil
}

// Run calls call, and when its error says that Redis lacks the function,
// loads the library on c and calls call once more. It returns call's error,
// or Load's.
func (l *Library) Run(ctx context.Context, c redis.UniversalClient, call func() error) error {
	err := call()
	if !IsNotFound(err) {
		return err
	}
	if err := l.Load(ctx, c); err != nil {
		return err
	}
	return call()
}

// Ready checks that every master of c answers and has the library: PING,
// then FUNCTION LIST for the library's name, loading it where it is
// missing.
func (l *Library) Ready(ctx context.Context, c redis.UniversalClient) error {
	return EachMaster(ctx, c, func(ctx context.Context, m redis.UniversalClient) error {
		if err := m.Ping(ctx).Err(); err != nil {
			return err
		}
		libs, err := m.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: l.Name}).Result()
		if err != nil {
			return err
		}
		if len(libs) > 0 {
			return nil
		}
		return m.FunctionLoadReplace(ctx, l.Code).Err()
	})
}

// EachMaster calls fn with every master of c known to a *redis.ClusterClient
// (concurrently, as ClusterClient.ForEachMaster does), or once with c itself.
func EachMaster(ctx context.Context, c redis.UniversalClient, fn func(context.Context, redis.UniversalClient) error) error {
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return fn(ctx, m) })
	}
	return fn(ctx, c)
}
