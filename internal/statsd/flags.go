package statsd

import (
	"errors"
	"flag"
	"fmt"
	"net"
)

// Bind declares charon serve's statsd flags on fs, with o's values as
// defaults: --statsd-addr (Addr; empty sends nothing), --statsd-protocol
// and --statsd-flush-interval (which, unlike a zero FlushInterval, must be
// positive: charon serve's default is 1s).
func (o *Options) Bind(fs *flag.FlagSet) {
	fs.StringVar(&o.Addr, "statsd-addr", o.Addr, "send envoyproxy/ratelimit's statsd stats (its names) to this `host:port`")
	fs.Var(&o.Protocol, "statsd-protocol", "send the statsd stats over `udp` (the default) or tcp (newline-separated lines on one connection, redialled; dropped rather than waited for while it is down)")
	fs.DurationVar(&o.FlushInterval, "statsd-flush-interval", o.FlushInterval, "how often buffered statsd stats are sent at the latest")
}

// Check refuses flag values that cannot work, naming the flag.
func (o *Options) Check() error {
	if o.FlushInterval <= 0 {
		return errors.New("--statsd-flush-interval must be positive")
	}
	if o.Addr != "" {
		if _, _, err := net.SplitHostPort(o.Addr); err != nil {
			return fmt.Errorf("--statsd-addr %q: want host:port", o.Addr)
		}
	}
	return nil
}
