package server

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/charonlimit/charon/config"
)

// LoadFunc loads a configuration directory; config.Load with fixed options
// is the usual one.
type LoadFunc func(fsys fs.FS) (*config.Config, []config.Warning, error)

// Reloader watches a configuration directory and applies every valid new
// configuration. It polls: each Check fingerprints the directory (names,
// sizes, modification times and inodes, following symlinks, plus symlink
// targets), and loads only when the fingerprint changed. Polling sees a
// Kubernetes ConfigMap's "..data" symlink swap and envoyproxy/ratelimit's
// runtime layout alike, with no platform-specific notification API.
//
// Names starting with "." are hidden from the loader (a ConfigMap keeps its
// real files in "..<timestamp>" directories; loading them too would define
// every domain twice).
//
// Safe for concurrent use; use NewReloader.
type Reloader struct {
	dir     string
	load    LoadFunc
	apply   func(*config.Config)
	metrics *Metrics
	log     *slog.Logger

	mu      sync.Mutex // serializes Check
	last    [sha256.Size]byte
	checked bool
	current atomic.Pointer[config.Config]
}

// NewReloader returns a Reloader of dir. apply receives every configuration
// that loads without error, including the first.
func NewReloader(dir string, load LoadFunc, apply func(*config.Config), m *Metrics, log *slog.Logger) *Reloader {
	return &Reloader{dir: dir, load: load, apply: apply, metrics: m, log: log}
}

// Current returns the configuration in force, or nil before the first
// successful load.
func (r *Reloader) Current() *config.Config { return r.current.Load() }

// Check loads the directory when it changed since the last Check (the first
// Check always loads). changed reports whether a load was attempted; err is
// the load's error, after which the previous configuration stays in force.
func (r *Reloader) Check() (changed bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sum, ferr := fingerprint(r.dir)
	if ferr == nil && r.checked && sum == r.last {
		return false, nil
	}
	if ferr != nil {
		// Retry on the next poll, whatever the cause.
		r.checked = false
		err = ferr
	} else {
		r.last, r.checked = sum, true
		err = r.loadAndApply()
	}
	if err != nil {
		r.metrics.reloaded(false)
		logLoadError(r.log, r.dir, err, r.current.Load() != nil)
		return true, err
	}
	r.metrics.reloaded(true)
	return true, nil
}

func (r *Reloader) loadAndApply() error {
	cfg, warns, err := r.load(config.DirFS(r.dir))
	for _, w := range warns {
		r.log.Warn("config warning", "warning", w.String())
	}
	if err != nil {
		return err
	}
	if cfg == nil {
		return errors.New("server: config loader returned no configuration")
	}
	r.apply(cfg)
	r.current.Store(cfg)
	r.log.Info("config loaded", "dir", r.dir, "warnings", len(warns))
	if cfg.Tree == nil || len(cfg.Tree.Domains()) == 0 {
		r.log.Warn(EmptyConfig+": is the directory the one meant (a mistyped --config, CHARON_CONFIG or RUNTIME_ROOT, a volume not mounted)? "+
			"Put envoyproxy/ratelimit YAML files there, one domain each; they are loaded without a restart", "dir", r.dir)
	}
	return nil
}

// EmptyConfig says what a configuration with no domain means.
const EmptyConfig = "the configuration has no domain: every request is answered OK and nothing is limited"

// logLoadError logs each joined error on its own line ("file:line: path:
// message").
func logLoadError(log *slog.Logger, dir string, err error, keeping bool) {
	msg := "config rejected"
	if keeping {
		msg = "config rejected; the last good configuration stays in force"
	}
	for _, e := range config.Problems(err) {
		log.Error(msg, "dir", dir, "err", e.Error())
	}
}

// Run calls Check every interval until ctx is done.
func (r *Reloader) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.Check()
		}
	}
}

// fingerprint hashes what a change of the directory's content changes.
func fingerprint(dir string) ([sha256.Size]byte, error) {
	h := sha256.New()
	var buf [8]byte
	num := func(v uint64) {
		binary.LittleEndian.PutUint64(buf[:], v)
		h.Write(buf[:])
	}
	var walk func(path, rel string, depth int) error
	walk = func(path, rel string, depth int) error {
		if depth > 16 {
			return fmt.Errorf("server: %s: directories nested too deep", path)
		}
		ents, err := os.ReadDir(path)
		if err != nil {
			return err
		}
		names := make([]string, 0, len(ents))
		for _, e := range ents {
			names = append(names, e.Name())
		}
		sort.Strings(names)
		for _, name := range names {
			p := filepath.Join(path, name)
			h.Write([]byte(rel + "/" + name + "\x00"))
			if target, err := os.Readlink(p); err == nil {
				h.Write([]byte(target + "\x00"))
			}
			if strings.HasPrefix(name, ".") {
				continue // the targets of dot symlinks are hashed above
			}
			fi, err := os.Stat(p)
			if err != nil {
				continue // a dangling symlink: its name and target are hashed
			}
			if fi.IsDir() {
				if err := walk(p, rel+"/"+name, depth+1); err != nil {
					return err
				}
				continue
			}
			num(uint64(fi.Size()))
			num(uint64(fi.ModTime().UnixNano()))
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				num(st.Ino)
				num(st.Dev)
			}
		}
		return nil
	}
	var sum [sha256.Size]byte
	if err := walk(dir, "", 0); err != nil {
		return sum, err
	}
	copy(sum[:], h.Sum(nil))
	return sum, nil
}
