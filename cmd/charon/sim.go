package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/charonlimit/charon/internal/clientcmd"
	"github.com/charonlimit/charon/internal/sim"
)

// runSim serves the tier simulator on its own, or writes its files.
func runSim(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("charon sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8090", "serve the simulator at `HOST:PORT`")
	out := fs.String("out", "", "write the page's files into this `directory` instead of serving them")
	if err := clientcmd.ParseFlags(fs, args); err != nil {
		return err
	}
	if *out != "" {
		if err := sim.WriteFiles(*out); err != nil {
			return err
		}
		fmt.Fprintln(stdout, *out)
		return nil
	}
	if !sim.Built() {
		fmt.Fprintln(stderr, "charon: this binary was built without the simulator's engine (make sim-wasm before building): the page will say so")
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "the tier simulator: http://%s/\n", ln.Addr())
	srv := &http.Server{Handler: sim.Handler(), ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
