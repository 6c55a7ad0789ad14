package redisbackend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The replicas sharing a Redis count themselves there, so that the local
// failure mode can divide each limit among them (resilient.SetReplicas):
// each process beats every PresenceInterval, which stamps its id with
// Redis' clock in the sorted set PresenceKey, drops the ids not stamped
// within PresenceTTL, and answers how many remain. A process that stops
// cleanly removes its id; one that dies drops out after PresenceTTL. While
// Redis does not answer, no beat succeeds and the count stays the last one
// seen: the count of the replicas that shared the store before the outage.

// Defaults of the presence beat.
const (
	// PresenceKey is the sorted set of the processes sharing the Redis
	// (its hash slot is that of the whole name: one Cluster master).
	PresenceKey = "charon:replicas"
	// PresenceInterval is how often a process beats.
	PresenceInterval = time.Second
	// PresenceTTL is how long a process that stopped beating still counts.
	// Ten beats: a process missing a few (a slow Redis, a long GC) is not
	// dropped, and a replica gone counts for at most that long, which can
	// only make the others' shares smaller during an outage.
	PresenceTTL = 10 * time.Second
)

// beatScript stamps ARGV[1] with Redis' clock in KEYS[1], forgets the ids
// not stamped within ARGV[2] ms, keeps the set that long after the last
// beat, and returns how many ids remain. Redis' clock rather than each
// process's: the processes' clocks may disagree by more than the TTL.
var beatScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - ttl))
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('ZCARD', KEYS[1])
`)

// presence is one process's entry in PresenceKey. Safe for concurrent use.
type presence struct {
	client redis.UniversalClient
	id     string
	ttl    time.Duration
}

func newPresence(c redis.UniversalClient, ttl time.Duration) *presence {
	return &presence{client: c, id: presenceID(), ttl: ttl}
}

// presenceID names this process: its host, its pid and 48 random bits
// (two processes of one pid on hosts of one name stay two).
func presenceID() string {
	host, _ := os.Hostname()
	var r [6]byte
	rand.Read(r[:])
	return host + "/" + strconv.Itoa(os.Getpid()) + "/" + hex.EncodeToString(r[:])
}

// beat stamps the entry and returns how many processes share the Redis,
// this one included.
func (p *presence) beat(ctx context.Context) (int, error) {
	n, err := beatScript.Run(ctx, p.client, []string{PresenceKey}, p.id, p.ttl.Milliseconds()).Int()
	return n, err
}

// leave removes the entry: the others count one fewer at once.
func (p *presence) leave(ctx context.Context) error {
	return p.client.ZRem(ctx, PresenceKey, p.id).Err()
}
