package xdsconfig

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/charonlimit/charon/internal/tlsconfig"
)

// Flags are the xDS settings of `charon serve` as command-line flags. The
// zero value is not useful; start from DefaultFlags.
type Flags struct {
	// Addr turns xDS on: the server's host:port.
	Addr         string
	NodeID       string
	NodeMetadata Pairs
	Headers      Pairs
	// TLS is --config-xds-tls (Force: system roots) and --config-xds-tls-*.
	TLS            tlsconfig.ClientFlags
	Backoff        Backoff
	MaxRecvMsgSize int
	NACKDelay      time.Duration
	// ForceStart serves, healthy and with no domains, before the first
	// configuration (envoyproxy/ratelimit's
	// FORCE_START_WITHOUT_INITIAL_CONFIG); without it the server waits,
	// NOT_SERVING.
	ForceStart bool
}

// DefaultFlags returns the defaults.
func DefaultFlags() Flags {
	return Flags{
		NodeID:         DefaultNodeID,
		NodeMetadata:   Pairs{Sep: "=", Skip: true},
		Headers:        Pairs{Sep: ":"},
		Backoff:        DefaultBackoff,
		MaxRecvMsgSize: DefaultMaxRecvMsgSize,
		NACKDelay:      DefaultNACKDelay,
	}
}

// Bind declares --config-xds and --config-xds-* on fs, with f's values as
// defaults.
func (f *Flags) Bind(fs *flag.FlagSet) {
	fs.StringVar(&f.Addr, "config-xds", f.Addr, "take the configuration from this xDS management server (`host:port`), State of the World ADS, instead of --config")
	fs.StringVar(&f.NodeID, "config-xds-node-id", f.NodeID, "the node `id` the xDS server knows this process by (its snapshots are per node)")
	fs.Var(&f.NodeMetadata, "config-xds-node-metadata", "the node's metadata, `key=value,...`")
	fs.Var(&f.Headers, "config-xds-headers", "gRPC headers of the xDS stream, `name:value,...` (an authorization token, say); better set with the environment than on a command line ps shows")
	fs.BoolVar(&f.TLS.Force, "config-xds-tls", f.TLS.Force, "reach the xDS server over TLS (system roots unless --config-xds-tls-ca); any --config-xds-tls-* flag turns TLS on")
	f.TLS.Bind(fs, "config-xds-tls-", "the xDS server")
	fs.DurationVar(&f.Backoff.Initial, "config-xds-backoff-initial", f.Backoff.Initial, "wait before reconnecting to the xDS server after a failed or broken stream, at first")
	fs.DurationVar(&f.Backoff.Max, "config-xds-backoff-max", f.Backoff.Max, "the longest wait before reconnecting to the xDS server")
	fs.Float64Var(&f.Backoff.Factor, "config-xds-backoff-factor", f.Backoff.Factor, "each reconnection waits this many times the last (at least the initial wait, at most the longest)")
	fs.BoolVar(&f.Backoff.Jitter, "config-xds-backoff-jitter", f.Backoff.Jitter, "draw each wait at random between the initial wait and its step")
	fs.IntVar(&f.MaxRecvMsgSize, "config-xds-max-msg-size", f.MaxRecvMsgSize, "the largest xDS response accepted, in `bytes`")
	fs.DurationVar(&f.NACKDelay, "config-xds-nack-delay", f.NACKDelay, "the least time between two NACKs of rejected configurations (a rejected version sent straight back is not validated again)")
	fs.BoolVar(&f.ForceStart, "config-xds-force-start", f.ForceStart, "serve, healthy and with no domains, before the first configuration from the xDS server; without it health is NOT_SERVING and requests are answered UNAVAILABLE until then")
}

// On reports whether xDS is asked for.
func (f *Flags) On() bool { return f.Addr != "" }

// Check refuses settings that cannot work, naming the flag; it reads the
// TLS files once, so that a wrong one stops the start.
func (f *Flags) Check() error {
	if !f.On() {
		if f.ForceStart {
			return errors.New("--config-xds-force-start needs --config-xds")
		}
		return nil
	}
	if _, _, err := net.SplitHostPort(f.Addr); err != nil && !strings.Contains(f.Addr, ":///") {
		return fmt.Errorf("--config-xds %q: want host:port", f.Addr)
	}
	switch {
	case f.NodeID == "":
		return errors.New("--config-xds-node-id must not be empty")
	case f.MaxRecvMsgSize <= 0:
		return errors.New("--config-xds-max-msg-size must be positive")
	case f.NACKDelay <= 0:
		return errors.New("--config-xds-nack-delay must be positive")
	}
	if err := f.Backoff.Check(); err != nil {
		return errors.New("--config-xds-backoff-*: " + err.Error())
	}
	if _, err := f.TLS.Config(); err != nil {
		return errors.New("--config-xds-tls-*: " + err.Error())
	}
	return nil
}

// Options returns the Options the flags make, with Load, Apply, Rejected
// and Logger left to the caller. TLS files are read again for each
// connection.
func (f *Flags) Options() Options {
	o := Options{Addr: f.Addr, NodeID: f.NodeID, NodeMetadata: f.NodeMetadata.M, Headers: f.Headers.M,
		MaxRecvMsgSize: f.MaxRecvMsgSize, Backoff: f.Backoff, NACKDelay: f.NACKDelay}
	if f.TLS.On() {
		tc := f.TLS
		o.TLS = func() (*tls.Config, error) { return tc.Config() }
	}
	return o
}

// Pairs is a flag of comma-separated name-value pairs, each split at the
// first Sep ("a=1,b=2"). Empty entries are skipped; an entry without Sep
// or with an empty name is an error.
type Pairs struct {
	Sep string
	M   map[string]string
	// Skip passes over an entry without Sep (or without a name), as
	// envoyproxy/ratelimit does for the node's metadata, instead of
	// refusing it.
	Skip bool
}

func (p *Pairs) String() string {
	if p == nil || len(p.M) == 0 {
		return ""
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(p.M)) {
		parts = append(parts, k+p.Sep+p.M[k])
	}
	return strings.Join(parts, ",")
}

// Set replaces the pairs with those of s.
func (p *Pairs) Set(s string) error {
	m := map[string]string{}
	for i, e := range strings.Split(s, ",") {
		if strings.TrimSpace(e) == "" {
			continue
		}
		k, v, ok := strings.Cut(e, p.Sep)
		if k = strings.TrimSpace(k); (!ok || k == "") && p.Skip {
			continue
		}
		if !ok || k == "" {
			// Not the entry: a header's may be a secret.
			return fmt.Errorf("entry %d: want name%svalue", i+1, p.Sep)
		}
		m[k] = v
	}
	p.M = m
	return nil
}
