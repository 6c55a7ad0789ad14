package escrow

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/charonlimit/charon/internal/store"
)

// sketchWidth is the counters per row of the sketch.
const sketchWidth = 4096

// sketch counts the decisions of the pairs not in escrow over the current
// sketchPeriod, in two rows of counters indexed by two hashes of the pair
// (a count-min sketch): a pair's count is at least its decisions, more
// when pairs collide in both rows, so a pair is never found hot late,
// and a cold pair found hot by a collision cools out of escrow again.
// Adding is lock-free; rotate starts a new period.
type sketch struct {
	seed  maphash.Seed
	rows  [2][sketchWidth]atomic.Uint32
	mu    sync.Mutex // rotate
	start atomic.Int64
}

func (k *sketch) init(now time.Time) {
	k.seed = maphash.MakeSeed()
	k.start.Store(now.UnixNano())
}

// add counts one decision of key and returns its rate so far in the
// period, in decisions per second of the period.
func (k *sketch) add(key store.Key) float64 {
	h := key.Hash(k.seed)
	a := k.rows[0][h%sketchWidth].Add(1)
	b := k.rows[1][(h>>32)%sketchWidth].Add(1)
	return float64(min(a, b)) / sketchPeriod.Seconds()
}

// rotate clears the counts once a period has passed since the last.
func (k *sketch) rotate(now time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if now.UnixNano()-k.start.Load() < int64(sketchPeriod) {
		return
	}
	k.start.Store(now.UnixNano())
	for r := range k.rows {
		for i := range k.rows[r] {
			k.rows[r][i].Store(0)
		}
	}
}
