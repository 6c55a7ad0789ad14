package redisstore

import "testing"

// TestStuckWatch: a call is stuck only when every dispatcher has had a
// batch in flight since the call was queued (its mark): not while a
// dispatcher is idle, nor once a dispatcher took a newer batch (it was
// answered, or gave up, meanwhile), nor without dispatchers.
func TestStuckWatch(t *testing.T) {
	var w stuckWatch
	if w.stuck(w.mark()) {
		t.Error("no dispatchers: stuck")
	}
	w.dispatchers = 2
	w.begin()
	m := w.mark()
	if w.stuck(m) {
		t.Error("one of two dispatchers idle: stuck")
	}
	w.begin()
	if w.stuck(m) {
		t.Error("the second dispatcher took a batch after the mark: stuck")
	}
	m = w.mark()
	if !w.stuck(m) {
		t.Error("both dispatchers in flight since the mark: not stuck")
	}
	w.end()
	if w.stuck(m) {
		t.Error("a dispatcher's batch ended: stuck")
	}
	w.begin()
	if w.stuck(m) {
		t.Error("a dispatcher took a newer batch: stuck")
	}
	if !w.stuck(w.mark()) {
		t.Error("both in flight since a new mark: not stuck")
	}
}
