package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/charonlimit/charon/internal/redisfunc"
)

// errNotRun is the answer of a call that a Cluster master's batch did not
// make because the master does not serve its slot (fxbatch in decide.lua:
// its reply starts with notRunPrefix). runNodes sends it again as its own
// FCALL.
var errNotRun = errors.New("redisstore: not run by the node's batch")

const notRunPrefix = "NOTRUN "

// nodeBatch is the requests of a dispatcher's batch whose keys a Cluster
// master serves, by the client's slot map, and the buffers of the FCALL
// of the node's batch function that makes them.
type nodeBatch struct {
	node *redis.Client
	idx  []int
	args []any
	hdr  []byte
	err  error
}

// runNodes sends the sent requests of d on a Cluster: those whose keys'
// slots one master serves (by the client's slot map), two or more, go to
// that master as one FCALL of the Cluster batch function (fxbatch), which
// makes each call as its own FCALL would, in order (on Redis's clock at
// one instant: the master's batch is one atomic step); the others go as a
// pipeline of FCALLs through the Cluster client. The masters' batches go
// at once, each on its own connection. A call that a master's batch did
// not make because the master no longer serves its slot (a slot moved, or
// migrating, or the cluster down) is sent again as its own FCALL, which
// follows MOVED and ASK redirections; so are the calls of a batch that
// Redis refused as a whole (an error reply: it ran nothing). A batch whose
// reply was lost fails its calls with the error, as a pipeline would (they
// may have run).
func (s *Store) runNodes(ctx context.Context, d *dispatcher) {
	for _, nb := range d.nodes {
		nb.node, nb.idx, nb.err = nil, nb.idx[:0], nil
	}
	nn := 0
	d.single = d.single[:0]
	for i, r := range d.batch {
		if !d.sent[i] {
			continue
		}
		k, ok := r.args[2].(int)
		if !ok || k == 0 {
			d.single = append(d.single, i)
			continue
		}
		key, _ := r.args[3].(string)
		node, err := s.nodes.MasterForKey(ctx, key)
		if err != nil {
			d.single = append(d.single, i)
			continue
		}
		var nb *nodeBatch
		for _, b := range d.nodes[:nn] {
			if b.node == node {
				nb = b
				break
			}
		}
		if nb == nil {
			if nn == len(d.nodes) {
				d.nodes = append(d.nodes, new(nodeBatch))
			}
			nb = d.nodes[nn]
			nb.node = node
			nn++
		}
		nb.idx = append(nb.idx, i)
	}
	var wg sync.WaitGroup
	for _, nb := range d.nodes[:nn] {
		if len(nb.idx) == 1 {
			d.single = append(d.single, nb.idx[0])
			nb.idx = nb.idx[:0]
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.runNode(ctx, d, nb)
		}()
	}
	if len(d.single) > 0 {
		s.pipeline(ctx, d, d.single)
	}
	wg.Wait()
	// The calls the masters did not make, as their own FCALLs.
	d.single = d.single[:0]
	for _, nb := range d.nodes[:nn] {
		for _, i := range nb.idx {
			if d.batch[i].err == errNotRun || (nb.err != nil && d.batch[i].err == nil) {
				d.batch[i].err = nil
				d.single = append(d.single, i)
			}
		}
	}
	if len(d.single) > 0 {
		s.pipeline(ctx, d, d.single)
	}
	for _, nb := range d.nodes[:nn] {
		clear(nb.args)
		nb.node = nil
	}
}

// runNode sends the requests nb.idx of d as one FCALL of the Cluster batch
// function on nb.node and sets their replies or errors. It sets nb.err
// when Redis refused the batch as a whole (its calls did not run), loading
// the function first when the node did not have it.
func (s *Store) runNode(ctx context.Context, d *dispatcher, nb *nodeBatch) {
	nb.args, nb.hdr = batchCall(nb.args, nb.hdr, xbatchArg, d.batch, nb.idx)
	err := s.sendBatch(ctx, nb.node, nb.args, d, nb.idx)
	if err == nil {
		return
	}
	var re redis.Error
	if errors.As(err, &re) && !redisfunc.IsNotFound(err) {
		nb.err = err // refused: sent again one by one
		return
	}
	for _, i := range nb.idx {
		d.batch[i].err = fmt.Errorf("redisstore: %w", err)
	}
}

// pipeline sends the requests idx of d as one pipeline of FCALLs through
// the client (on a Cluster, split by node and following redirections) and
// sets their replies, loading the function and sending those calls again
// when Redis does not have it.
func (s *Store) pipeline(ctx context.Context, d *dispatcher, idx []int) {
	d.cmds, d.retry = d.cmds[:0], d.retry[:0]
	pipe := s.c.Pipeline()
	for _, i := range idx {
		cmd := redis.NewCmd(ctx, d.batch[i].args...)
		_ = pipe.Process(ctx, cmd)
		d.cmds = append(d.cmds, cmd)
	}
	_, _ = pipe.Exec(ctx)
	for k, cmd := range d.cmds {
		if redisfunc.IsNotFound(cmd.Err()) {
			d.retry = append(d.retry, k)
		}
	}
	if len(d.retry) > 0 {
		if err := s.Load(ctx); err != nil {
			for _, k := range d.retry {
				d.batch[idx[k]].err = err
				d.cmds[k] = nil
			}
		} else {
			pipe := s.c.Pipeline()
			for _, k := range d.retry {
				d.cmds[k] = redis.NewCmd(ctx, d.batch[idx[k]].args...)
				_ = pipe.Process(ctx, d.cmds[k])
			}
			_, _ = pipe.Exec(ctx)
		}
	}
	for k, cmd := range d.cmds {
		if cmd == nil {
			continue
		}
		res, err := cmd.Text()
		if err != nil {
			d.batch[idx[k]].err = wrapReply(err)
			continue
		}
		d.batch[idx[k]].res = res
	}
}
