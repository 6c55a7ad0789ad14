package redisbackend

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/escrow"
)

// EscrowPool returns the escrow region pool on this Redis: the slices of
// home budgets a region's replicas share (escrow.Region).
func (b *Backend) EscrowPool() escrow.Pool { return &escrowPool{client: b.client} }

// escrowPool keeps each pair's slices in one hash, on Redis's clock
// (TIME): fields s:<id> (the hits left) and e:<id> (the end, in ms),
// d:<owner> (a replica's demand and when it said so), ru (refused until,
// ms), rr (the refusal's retry, ms) and rf (its flags: h for hard, g for
// global, u for no retry). The refill
// lock is a key beside it. Both share a hash tag, so that a Cluster keeps
// them on one slot.
type escrowPool struct {
	client redis.UniversalClient
}

// poolKeys names a pair's hash and lock. The tag is a digest of the
// pair's name: a name may hold braces, which would move the tag.
func poolKeys(k string) []string {
	sum := sha256.Sum256([]byte(k))
	tag := "charon:escrow:{" + hex.EncodeToString(sum[:16]) + "}"
	return []string{tag, tag + ":lock"}
}

// poolTake takes up to ARGV[1] hits from the open slice that stays open
// at least ARGV[2] ms and ends first, forgets slices ARGV[3] ms past their
// end (no one closed them), and returns {n, id, left, open,
// refused, retry, flags, now}.
var poolTake = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local want, need, forget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local h = redis.call('HGETALL', KEYS[1])
local f = {}
for i = 1, #h, 2 do f[h[i]] = h[i + 1] end
local best, bestEnd, left, open = nil, nil, 0, 0
for name, v in pairs(f) do
  if string.sub(name, 1, 2) == 's:' then
    local id = string.sub(name, 3)
    local e = tonumber(f['e:' .. id]) or 0
    if e + forget <= now then
      redis.call('HDEL', KEYS[1], name, 'e:' .. id)
    else
      if e - now > open then open = e - now end
      local n = tonumber(v)
      if e - now >= need and n > 0 then
        left = left + n
        if best == nil or e < bestEnd or (e == bestEnd and id < best) then best, bestEnd = id, e end
      end
    end
  end
end
local n = 0
if best ~= nil and want > 0 then
  n = math.min(want, tonumber(f['s:' .. best]))
  redis.call('HINCRBY', KEYS[1], 's:' .. best, -n)
  left = left - n
end
if n == 0 then best = '0' end
local refused = 0
local ru = tonumber(f['ru'])
if ru ~= nil and ru > now then refused = ru - now end
return {n, best, left, open, refused, tonumber(f['rr']) or 0, f['rf'] or '', now}
`)

// poolPut puts ARGV[2] hits back into slice ARGV[1] while it is open.
var poolPut = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local e = tonumber(redis.call('HGET', KEYS[1], 'e:' .. ARGV[1]))
if e == nil or e <= now or redis.call('HEXISTS', KEYS[1], 's:' .. ARGV[1]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[1], 's:' .. ARGV[1], ARGV[2])
return 1
`)

// poolAdd opens slice ARGV[1] of ARGV[2] hits until ARGV[3] (ms on
// Redis's clock) unless that has passed (a slice of that id still open
// gets the hits added and the later end), and keeps the hash at least
// ARGV[4] ms after that.
var poolAdd = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local d = tonumber(ARGV[3]) - now
if d <= 0 then return 0 end
local e = tonumber(redis.call('HGET', KEYS[1], 'e:' .. ARGV[1]))
if e ~= nil and redis.call('HEXISTS', KEYS[1], 's:' .. ARGV[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], 's:' .. ARGV[1], ARGV[2])
  if e > tonumber(ARGV[3]) then d = e - now else redis.call('HSET', KEYS[1], 'e:' .. ARGV[1], ARGV[3]) end
else
  redis.call('HSET', KEYS[1], 's:' .. ARGV[1], ARGV[2], 'e:' .. ARGV[1], ARGV[3])
end
if redis.call('PTTL', KEYS[1]) < d + tonumber(ARGV[4]) then redis.call('PEXPIRE', KEYS[1], d + tonumber(ARGV[4])) end
return 1
`)

// poolClose closes slice ARGV[1] and returns what it had left.
var poolClose = redis.NewScript(`
local n = tonumber(redis.call('HGET', KEYS[1], 's:' .. ARGV[1])) or 0
redis.call('HDEL', KEYS[1], 's:' .. ARGV[1], 'e:' .. ARGV[1])
if n < 0 then n = 0 end
return n
`)

// poolRefuse records a refusal for ARGV[1] ms.
var poolRefuse = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'ru', now + tonumber(ARGV[1]), 'rr', ARGV[2], 'rf', ARGV[3])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[1]) + tonumber(ARGV[4]) then redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]) + tonumber(ARGV[4])) end
return 1
`)

// poolReport records ARGV[1]'s demand ARGV[2] (0 withdraws it), forgets
// the demands not reported within ARGV[3] ms, and returns the sum of the
// others, as a string (a Lua number would be cut to an integer).
var poolReport = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rate, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
if rate > 0 then
  redis.call('HSET', KEYS[1], 'd:' .. ARGV[1], ARGV[2] .. ':' .. now)
else
  redis.call('HDEL', KEYS[1], 'd:' .. ARGV[1])
end
local h = redis.call('HGETALL', KEYS[1])
local sum = 0
for i = 1, #h, 2 do
  if string.sub(h[i], 1, 2) == 'd:' then
    local r, at = string.match(h[i + 1], '^([^:]+):(%d+)$')
    if r == nil or now - tonumber(at) > ttl then
      redis.call('HDEL', KEYS[1], h[i])
    else
      sum = sum + tonumber(r)
    end
  end
end
if redis.call('PTTL', KEYS[1]) < ttl + tonumber(ARGV[4]) then redis.call('PEXPIRE', KEYS[1], ttl + tonumber(ARGV[4])) end
return tostring(sum)
`)

// poolUnlock deletes the lock when ARGV[1] holds it.
var poolUnlock = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

// poolKeep is how long a pair's hash outlives its last slice or refusal.
const poolKeep = 2 * time.Minute

func (p *escrowPool) Take(ctx context.Context, k string, want int64, need time.Duration) (int64, int64, escrow.PoolState, error) {
	var st escrow.PoolState
	v, err := poolTake.Run(ctx, p.client, poolKeys(k)[:1], want, need.Milliseconds(), time.Minute.Milliseconds()).Slice()
	if err != nil {
		return 0, 0, st, err
	}
	if len(v) != 8 {
		return 0, 0, st, errors.New("escrow pool: a take's reply has " + strconv.Itoa(len(v)) + " fields, want 8")
	}
	n, _ := v[0].(int64)
	var id int64
	if s, ok := v[1].(string); ok {
		if id, err = strconv.ParseInt(s, 10, 64); err != nil {
			return 0, 0, st, errors.New("escrow pool: a slice's id " + strconv.Quote(s) + " is not a number")
		}
	}
	left, _ := v[2].(int64)
	open, _ := v[3].(int64)
	refused, _ := v[4].(int64)
	retry, _ := v[5].(int64)
	flags, _ := v[6].(string)
	at, _ := v[7].(int64)
	st = escrow.PoolState{Left: left, Open: time.Duration(open) * time.Millisecond,
		Refused: time.Duration(refused) * time.Millisecond, At: time.UnixMilli(at)}
	if refused > 0 {
		st.Refusal = escrow.Refusal{Retry: time.Duration(retry) * time.Millisecond}
		for _, c := range flags {
			switch c {
			case 'h':
				st.Refusal.Hard = true
			case 'g':
				st.Refusal.Global = true
			case 'u':
				st.Refusal.Retry = math.MaxInt64
			}
		}
	}
	return n, id, st, nil
}

func (p *escrowPool) Put(ctx context.Context, k string, id, n int64) (bool, error) {
	v, err := poolPut.Run(ctx, p.client, poolKeys(k)[:1], id, n).Int()
	return v == 1, err
}

func (p *escrowPool) Add(ctx context.Context, k string, id, n int64, end time.Time) error {
	return poolAdd.Run(ctx, p.client, poolKeys(k)[:1], id, n, end.UnixMilli(), poolKeep.Milliseconds()).Err()
}

func (p *escrowPool) Close(ctx context.Context, k string, id int64) (int64, error) {
	return poolClose.Run(ctx, p.client, poolKeys(k)[:1], id).Int64()
}

func (p *escrowPool) Refuse(ctx context.Context, k string, d time.Duration, r escrow.Refusal) error {
	flags := ""
	if r.Hard {
		flags += "h"
	}
	if r.Global {
		flags += "g"
	}
	retry := r.Retry.Milliseconds()
	if r.Retry == math.MaxInt64 { // tiers.Unbounded: no wait suffices
		flags, retry = flags+"u", 0
	}
	return poolRefuse.Run(ctx, p.client, poolKeys(k)[:1], d.Milliseconds(), retry, flags, poolKeep.Milliseconds()).Err()
}

func (p *escrowPool) Report(ctx context.Context, k, owner string, rate float64, ttl time.Duration) (float64, error) {
	v, err := poolReport.Run(ctx, p.client, poolKeys(k)[:1], owner, strconv.FormatFloat(rate, 'g', -1, 64), ttl.Milliseconds(), poolKeep.Milliseconds()).Text()
	if err != nil {
		return 0, err
	}
	sum, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, errors.New("escrow pool: a demand's sum " + strconv.Quote(v) + " is not a number")
	}
	return sum, nil
}

func (p *escrowPool) Lock(ctx context.Context, k, owner string, ttl time.Duration) (bool, error) {
	return p.client.SetNX(ctx, poolKeys(k)[1], owner, ttl).Result()
}

func (p *escrowPool) Unlock(ctx context.Context, k, owner string) error {
	return poolUnlock.Run(ctx, p.client, poolKeys(k)[1:], owner).Err()
}
