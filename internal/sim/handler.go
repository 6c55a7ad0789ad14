package sim

import (
	"bytes"
	"compress/gzip"
	"embed"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// web holds the page; charon.wasm and wasm_exec.js are there once `go
// generate` (make sim-wasm) has built them.
//
//go:embed web
var web embed.FS

// Files returns the page's files (index.html, sim.js, sim.css, and, when
// built, charon.wasm and wasm_exec.js).
func Files() fs.FS {
	sub, err := fs.Sub(web, "web")
	if err != nil { // cannot happen: "web" is a valid name
		return web
	}
	return sub
}

// Built reports whether the engine was built into the binary.
func Built() bool {
	_, err := fs.Stat(Files(), "charon.wasm")
	return err == nil
}

// Handler serves the page at its root: mount it under a prefix with
// http.StripPrefix. The engine is sent gzip-compressed to clients that
// accept it. Safe for concurrent use.
func Handler() http.Handler { return HandlerFS(Files()) }

// HandlerFS is Handler serving files instead of the embedded page.
func HandlerFS(files fs.FS) http.Handler {
	static := http.FileServerFS(files)
	var once sync.Once
	var gz []byte
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.TrimPrefix(r.URL.Path, "/") != "charon.wasm" {
			static.ServeHTTP(w, r)
			return
		}
		raw, err := fs.ReadFile(files, "charon.wasm")
		if err != nil {
			http.Error(w, "the simulator's engine was not built into this binary (make sim-wasm before building)", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/wasm")
		w.Header().Set("Vary", "Accept-Encoding")
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Write(raw)
			return
		}
		once.Do(func() {
			var b bytes.Buffer
			zw, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
			zw.Write(raw)
			zw.Close()
			gz = b.Bytes()
		})
		w.Header().Set("Content-Encoding", "gzip")
		w.Write(gz)
	})
}

// WriteFiles writes the page's files into dir, for serving as static files.
func WriteFiles(dir string) error {
	if !Built() {
		return errNotBuilt
	}
	return fs.WalkDir(Files(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			if d != nil && d.IsDir() {
				return os.MkdirAll(filepath.Join(dir, p), 0o755)
			}
			return err
		}
		b, err := fs.ReadFile(Files(), p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, p), b, 0o644)
	})
}
