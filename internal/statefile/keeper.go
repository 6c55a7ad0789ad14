package statefile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"time"
)

// Source is the store whose states a Keeper keeps; *memstore.Store is one.
type Source interface {
	// Snapshot returns the store's states that are not yet to be
	// forgotten at now.
	Snapshot(now time.Time) []Record
	// Restore adds recs to the store, but those to be forgotten by now,
	// and returns how many it added.
	Restore(now time.Time, recs []Record) int
}

// Options configure a Keeper.
type Options struct {
	// Path is the state file.
	Path string
	// Interval, when positive, is how often a snapshot is written; a crash
	// loses at most that long of counts.
	Interval time.Duration
	// DiscardInvalid starts from empty state, with a warning, when the file
	// is corrupt, truncated, foreign or of another version (the file is
	// overwritten by the next snapshot); without it Open refuses.
	DiscardInvalid bool
	// SaveOn are signals that write a snapshot at once (charon serve:
	// SIGUSR1).
	SaveOn []os.Signal
	// Now is the clock of restores and snapshots; nil means time.Now.
	Now func() time.Time
	// Logger; nil logs nothing.
	Logger *slog.Logger
}

// Keeper restores a Source from its state file and writes snapshots of it.
// Create it with Open; its methods are safe for concurrent use.
type Keeper struct {
	src    Source
	opts   Options
	mu     sync.Mutex // serializes snapshots
	saved  atomic.Uint64
	failed atomic.Uint64
	sigs   chan os.Signal // nil without Options.SaveOn
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
}

// Open restores src from opts.Path (a missing file is a first start: src
// stays empty) and starts writing snapshots every opts.Interval and on
// opts.SaveOn. A file that cannot be read or decoded is an error naming it,
// unless opts.DiscardInvalid.
func Open(src Source, opts Options) (*Keeper, error) {
	if opts.Path == "" {
		return nil, errors.New("statefile: no path")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	k := &Keeper{src: src, opts: opts, stop: make(chan struct{}), done: make(chan struct{})}
	// A snapshot that cannot be written would lose every count at the
	// first restart, silently: refuse to start instead.
	if err := Writable(opts.Path); err != nil {
		return nil, err
	}
	recs, written, err := Read(opts.Path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		opts.Logger.Info("state file: none yet, starting empty", "file", opts.Path)
	case errors.Is(err, ErrEarlier):
		// An upgrade: the counts start afresh once (docs/operations.md,
		// "Upgrading"); the next snapshot writes this build's format.
		opts.Logger.Warn("state file: written by an earlier version, whose states this version keys differently; starting empty once",
			"file", opts.Path, "err", err.Error())
	case err != nil && (errors.Is(err, ErrForeign) || errors.Is(err, ErrVersion) || errors.Is(err, ErrCorrupt)) && opts.DiscardInvalid:
		opts.Logger.Warn("state file: invalid, starting empty as --state-file-discard-invalid says", "file", opts.Path, "err", err.Error())
	case err != nil:
		return nil, err
	default:
		now := opts.Now()
		n := src.Restore(now, recs)
		opts.Logger.Info("state file: restored", "file", opts.Path, "states", n, "expired", len(recs)-n,
			"age", now.Sub(time.UnixMicro(written)).Round(time.Millisecond).String())
	}
	if len(opts.SaveOn) > 0 {
		// Registered before Open returns: a signal sent once the caller
		// knows the keeper is up is a snapshot, not the signal's default.
		k.sigs = make(chan os.Signal, 1)
		signal.Notify(k.sigs, opts.SaveOn...)
	}
	go k.run()
	return k, nil
}

func (k *Keeper) run() {
	defer close(k.done)
	var tick <-chan time.Time
	if k.opts.Interval > 0 {
		t := time.NewTicker(k.opts.Interval)
		defer t.Stop()
		tick = t.C
	}
	if k.sigs != nil {
		defer signal.Stop(k.sigs)
	}
	for {
		select {
		case <-k.stop:
			return
		case <-tick:
		case <-k.sigs:
		}
		if err := k.Save(); err != nil {
			k.opts.Logger.Error("state file: snapshot failed; the counts since the last snapshot are lost if the process stops now",
				"file", k.opts.Path, "err", err.Error())
		}
	}
}

// Save writes a snapshot of the source now.
func (k *Keeper) Save() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.opts.Now()
	recs := k.src.Snapshot(now)
	if err := Write(k.opts.Path, now.UnixMicro(), recs); err != nil {
		k.failed.Add(1)
		return err
	}
	k.saved.Add(1)
	k.opts.Logger.Debug("state file: written", "file", k.opts.Path, "states", len(recs))
	return nil
}

// Saved returns how many snapshots were written.
func (k *Keeper) Saved() uint64 { return k.saved.Load() }

// Failed returns how many snapshots could not be written.
func (k *Keeper) Failed() uint64 { return k.failed.Load() }

// Close stops the periodic snapshots and writes a last one: call it once
// the source decides nothing more. Close is idempotent; only the first call
// writes.
func (k *Keeper) Close() error {
	var err error
	k.once.Do(func() {
		close(k.stop)
		<-k.done
		if err = k.Save(); err == nil {
			k.opts.Logger.Info("state file: written at shutdown", "file", k.opts.Path)
		}
	})
	if err != nil {
		return fmt.Errorf("statefile: last snapshot: %w", err)
	}
	return nil
}
