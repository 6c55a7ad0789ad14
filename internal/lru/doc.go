// Package lru is a map split into shards by a hash of the key, each shard
// with its own mutex, its own bound and its own least-recently-used order:
// the in-memory store keeps its rate-limit states in one, and the Redis
// store's over-limit cache its rejections.
//
// The caller locks a shard (Shard.Lock) around every use of
// it and of its entries; a caller that needs several shards at once locks
// them in ascending index order. The package takes no lock of its own, so a
// call can look up, create and update the entries of several shards under
// one set of locks.
//
// A hit (Get, Peek, Touch) makes no allocation; so does an Add that evicts
// to make room, which reuses the evicted entry.
package lru
