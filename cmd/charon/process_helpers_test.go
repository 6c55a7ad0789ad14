package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/charonlimit/charon/internal/redistest"
)

// writeConfigDir writes yaml as the file name in a new temporary directory
// and returns the directory, for --config.
func writeConfigDir(t *testing.T, name, yaml string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// processStore is a store a process test runs `charon serve` against.
type processStore struct {
	name string
	// args are the flags selecting the store; a Redis one starts its
	// redis-server processes for t (stopped at t's end).
	args func(t *testing.T) []string
}

// serveArgs are the flags of a server on this store with the configuration
// directory dir and --redis-timeout 5s, then extra. It starts the store's
// Redis for t.
func (s processStore) serveArgs(t *testing.T, dir string, extra ...string) []string {
	t.Helper()
	args := append([]string{"--config", dir, "--redis-timeout", "5s"}, s.args(t)...)
	return append(args, extra...)
}

// everyStore is the memory store, a single Redis and a 3-master Redis
// Cluster: the stores an *EveryStore process test runs on.
func everyStore() []processStore {
	return []processStore{
		{"memory", func(t *testing.T) []string { return nil }},
		{"redis", func(t *testing.T) []string {
			return []string{"--store", "redis", "--redis-url", "redis://" + redistest.Single(t).Addr()}
		}},
		{"redis-cluster", func(t *testing.T) []string {
			return []string{"--store", "redis", "--redis-url", "redis-cluster://" + strings.Join(redistest.Addrs(redistest.Cluster(t, 3)), ",")}
		}},
	}
}

// faultProxy forwards TCP connections to target until told otherwise: in
// hole mode every byte either way is swallowed (a Redis that stopped
// answering, connections left open: a black hole), in slow mode every
// chunk is held for delay first.
type faultProxy struct {
	addr  string
	mode  atomic.Int32 // proxyPass, proxyHole, proxySlow
	delay time.Duration
}

const (
	proxyPass int32 = iota
	proxyHole
	proxySlow
)

// newFaultProxy starts a faultProxy to target in pass mode; it and its
// connections are closed at t's end.
func newFaultProxy(t *testing.T, target string, delay time.Duration) *faultProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fp := &faultProxy{addr: lis.Addr().String(), delay: delay}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		lis.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		defer dst.Close()
		defer src.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				switch fp.mode.Load() {
				case proxyHole:
					continue
				case proxySlow:
					time.Sleep(fp.delay)
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			r, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, r)
			mu.Unlock()
			wg.Add(2)
			go pipe(r, c)
			go pipe(c, r)
		}
	}()
	return fp
}
