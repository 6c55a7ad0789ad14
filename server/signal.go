package server

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// StopOnSignal returns the context to Serve s with: done on SIGTERM, with
// the ShutdownDelay drain, or on SIGINT (an operator's Ctrl-C) without it
// (ErrStopNow); a second signal ends the drain (EndDrain). stop stops
// listening for signals and ends the context.
func (s *Server) StopOnSignal() (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGINT {
				cancel(ErrStopNow)
			} else {
				cancel(nil)
			}
		case <-done:
			return
		}
		select {
		case <-sigs:
			s.EndDrain()
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel(nil)
	}
}
