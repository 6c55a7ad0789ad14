package redisstore

import (
	"strconv"
	"strings"

	"github.com/charonlimit/charon/internal/store"
)

// Key layout (P is Options.KeyPrefix, R the escaped resource, D the escaped
// domain, S the shape of the pair's policy in hex, store.Key.PolicyID;
// escaped identities hold no ':', '{' or '}'):
//
//	P{R}         the resource's global state (hits of the last second)
//	P{R}:D:S     state of a pair whose policy has a global limit
//	P{R/D}:S     state of a pair whose policy has no global limit
//	Plock:{...}  the lock of a key during a two-step call (Cluster only)
//
// The hash tag keeps a resource with a global limit, all its domains and
// its global key in one Cluster slot, so that its requests are one script
// call; pairs without a global limit are spread per (resource, domain).
// A key holds no limit: a policy's new limits read the counts made under
// its old ones (SPEC §3). No hash tag holds a ':', while every tag of the
// layout of earlier versions (P{R:ID}, P{R:ID}:D, P{R:ID:D}, ID a hash of
// the policy with its limits) does: a key of an earlier version is never
// read, and expires by its own expiry.

// stateKey returns the key of it's pair state and, when its policy has a
// global limit, the key of the resource's global state.
func stateKey(prefix string, it *store.Item) (state, global string) {
	var id [16]byte
	hex := strconv.AppendUint(id[:0], it.Key.PolicyID, 16)
	k := &it.Key
	var b strings.Builder
	b.Grow(len(prefix) + len(k.Resource) + len(hex) + len(k.Domain) + 5)
	b.WriteString(prefix)
	b.WriteByte('{')
	b.WriteString(k.Resource)
	if it.Policy.GlobalLimit <= 0 {
		b.WriteByte('/')
		b.WriteString(k.Domain)
		b.WriteString("}:")
		b.Write(hex)
		return b.String(), ""
	}
	b.WriteByte('}')
	g := b.String()
	b.WriteByte(':')
	b.WriteString(k.Domain)
	b.WriteByte(':')
	b.Write(hex)
	return b.String(), g
}

// lockKey returns the lock key of key (same hash tag, so same slot).
func lockKey(prefix, key string) string {
	return prefix + "lock:" + key[len(prefix):]
}

// slot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of its
// hash tag (or of the whole key when it has none) modulo 16384.
func slot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return crcString(0, key) & 16383
}
