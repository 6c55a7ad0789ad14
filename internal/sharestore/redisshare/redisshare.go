// Package redisshare keeps the leases of the Rate Limit Quota Service in
// Redis (single, Sentinel or Cluster), so that replicas share one budget per
// rule. A budget is one hash, charon:rlqs:{KEY}, field per instance:
// "demand held expires_µs". Allocate reads it under WATCH, runs
// sharestore.Run in Go (the one implementation of the policy) on Redis'
// clock (TIME), and writes the result in MULTI/EXEC; a concurrent change of
// the budget by another replica retries. One budget is touched by each
// replica once per report interval, so retries are rare and short.
package redisshare

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/fairshare"
	"github.com/charonlimit/charon/internal/sharestore"
)

// maxTries bounds the optimistic retries of one Allocate.
const maxTries = 20

// Store is a sharestore.Store on a Redis client. Safe for concurrent use.
type Store struct {
	c redis.UniversalClient
}

// New returns a Store on c (which the Store does not own).
func New(c redis.UniversalClient) *Store { return &Store{c: c} }

// Key is the Redis key of a budget.
func Key(budget string) string { return "charon:rlqs:{" + budget + "}" }

// Allocate implements sharestore.Store; now is ignored for Redis TIME.
func (s *Store) Allocate(ctx context.Context, _ time.Time, b sharestore.Budget, mine []sharestore.Demand, ttl time.Duration, tolerance float64) ([]int64, error) {
	key := Key(b.Key)
	var shares []int64
	txf := func(tx *redis.Tx) error {
		now, err := tx.Time(ctx).Result()
		if err != nil {
			return err
		}
		fields, err := tx.HGetAll(ctx, key).Result()
		if err != nil {
			return err
		}
		others := make([]fairshare.Claim, 0, len(fields))
		var expired []string
		for id, v := range fields {
			c, ok := decode(id, v)
			if !ok || !now.Before(c.Expires) {
				expired = append(expired, id)
				continue
			}
			others = append(others, c)
		}
		shares = sharestore.Run(now, b.Limit, others, mine, tolerance)
		exp := now.Add(ttl)
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			if len(expired) > 0 {
				p.HDel(ctx, key, expired...)
			}
			if len(mine) > 0 {
				args := make([]any, 0, 2*len(mine))
				for i, d := range mine {
					args = append(args, d.ID, encode(d.Demand, shares[i], exp))
				}
				p.HSet(ctx, key, args...)
			}
			// Every lease of the hash ends by now+ttl or earlier (the
			// others' by their own, which were at most ttl when written).
			p.PExpireAt(ctx, key, exp.Add(time.Second))
			return nil
		})
		return err
	}
	for range maxTries {
		err := s.c.Watch(ctx, txf, key)
		if errors.Is(err, redis.TxFailedErr) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %w", sharestore.ErrUnavailable, err)
		}
		return shares, nil
	}
	return nil, fmt.Errorf("%w: budget %s changed %d times in a row", sharestore.ErrUnavailable, b.Key, maxTries)
}

func encode(demand, held int64, exp time.Time) string {
	return strconv.FormatInt(demand, 10) + " " + strconv.FormatInt(held, 10) + " " + strconv.FormatInt(exp.UnixMicro(), 10)
}

func decode(id, v string) (fairshare.Claim, bool) {
	f := strings.Fields(v)
	if len(f) != 3 {
		return fairshare.Claim{}, false
	}
	var n [3]int64
	for i := range f {
		x, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return fairshare.Claim{}, false
		}
		n[i] = x
	}
	return fairshare.Claim{ID: id, Demand: n[0], Held: n[1], Expires: time.UnixMicro(n[2])}, true
}
