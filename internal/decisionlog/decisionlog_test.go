package decisionlog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestSampling(t *testing.T) {
	var buf bytes.Buffer
	l := New(&buf, Options{Sample: 0.25, Rate: -1})
	kept := 0
	for range 20000 {
		w, ok := l.Keep(false)
		if ok {
			kept++
			if w != 4 {
				t.Fatalf("weight %v, want 4 (1/sample)", w)
			}
		}
	}
	// 5,000 expected; the binomial's standard deviation is 61.
	if kept < 4500 || kept > 5500 {
		t.Errorf("kept %d of 20000 at sample 0.25", kept)
	}
	for range 1000 {
		if w, ok := l.Keep(true); !ok || w != 1 {
			t.Fatalf("an important line was not kept with weight 1: %v %v", w, ok)
		}
	}
	l.Close()
	l0 := New(&buf, Options{Sample: 0})
	defer l0.Close()
	if _, ok := l0.Keep(false); ok {
		t.Error("sample 0 kept an ordinary line")
	}
}

func TestRateBound(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	var buf bytes.Buffer
	l := New(&buf, Options{Sample: 1, Rate: 10, Now: c.now})
	kept := 0
	for range 100 {
		if _, ok := l.Keep(true); ok {
			kept++
		}
	}
	c.add(time.Second)
	for range 5 {
		if _, ok := l.Keep(true); ok {
			kept++
		}
	}
	if kept != 15 || l.Stats().DroppedRate != 90 {
		t.Errorf("kept %d, dropped %d; want 15 and 90 (10 per second)", kept, l.Stats().DroppedRate)
	}
	l.Close()
}

// blockingWriter blocks every Write until released, and closes entered
// when the first Write begins.
type blockingWriter struct {
	release chan struct{}
	entered chan struct{}
	once    sync.Once
	buf     bytes.Buffer
}

func (w *blockingWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.entered) })
	<-w.release
	return w.buf.Write(p)
}

// TestFullQueueDropsWithoutBlocking: a writer that is stuck never holds up
// Log; what does not fit is counted, and what was queued is written on Close.
func TestFullQueueDropsWithoutBlocking(t *testing.T) {
	w := &blockingWriter{release: make(chan struct{}), entered: make(chan struct{})}
	l := New(w, Options{Sample: 1, Rate: -1, Queue: 4})
	// One line, flushed at once (nothing else waits), sticks the writer.
	l.Log(&Record{RLSDomain: "d", Result: ResultGranted, Weight: 1})
	select {
	case <-w.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the writer never wrote the first line")
	}
	done := make(chan struct{})
	go func() {
		for i := range 100 {
			l.Log(&Record{RLSDomain: "d", Hits: int64(i), Result: ResultGranted, Weight: 1})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Log blocked on a stuck writer")
	}
	close(w.release)
	l.Close()
	st := l.Stats()
	if st.DroppedQueue != 96 || st.Written != 5 {
		t.Errorf("stats %+v: want 5 written (the stuck line and a queue of 4), 96 dropped", st)
	}
}

func TestLinesReadBack(t *testing.T) {
	var buf bytes.Buffer
	l := New(&buf, Options{Sample: 1})
	at := time.Date(2030, 1, 2, 3, 4, 5, 6000, time.UTC)
	want := Record{Time: at, RLSDomain: "api", Entries: []Entry{{"user", "al\"ice"}}, Resource: "api/user", Domain: "al\"ice",
		Hits: 2, Granted: 0, Tier: 1, Result: ResultRejected, LimitedBy: "tier", Weight: 1}
	l.Log(&want)
	l.Close()
	sc := bufio.NewScanner(&buf)
	if !sc.Scan() {
		t.Fatal("no line written")
	}
	var got Record
	if err := json.Unmarshal(sc.Bytes(), &got); err != nil {
		t.Fatalf("line %q: %v", sc.Text(), err)
	}
	if got.Time.Equal(at) {
		got.Time = at
	}
	if got.Entries[0] != want.Entries[0] || got.Result != want.Result || got.Time != want.Time || got.LimitedBy != "tier" {
		t.Errorf("read back %+v, want %+v", got, want)
	}
}

func TestOpenTargets(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/d.log"
	l, err := Open(path, Options{Sample: 1})
	if err != nil {
		t.Fatal(err)
	}
	l.Log(&Record{RLSDomain: "a", Result: ResultGranted, Weight: 1})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || !bytes.Contains(b, []byte(`"rls_domain":"a"`)) {
		t.Fatalf("file holds %q, %v", b, err)
	}

	sock := dir + "/s"
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		b, _ := io.ReadAll(c)
		got <- b
	}()
	l, err = Open("unix:"+sock, Options{Sample: 1})
	if err != nil {
		t.Fatal(err)
	}
	l.Log(&Record{RLSDomain: "b", Result: ResultGranted, Weight: 1})
	l.Close()
	if b := <-got; !bytes.Contains(b, []byte(`"rls_domain":"b"`)) {
		t.Errorf("socket read %q", b)
	}
	if _, err := Open("unix:"+dir+"/none", Options{}); err == nil {
		t.Error("Open of a missing socket: no error")
	}
	if _, err := Open(dir+"/no/such/dir/f", Options{}); err == nil {
		t.Error("Open in a missing directory: no error")
	}
}
