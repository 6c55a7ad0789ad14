package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// sources records where serve's flags got their values, by flag name:
// "--config" (the command line), "CHARON_CONFIG", or the
// envoyproxy/ratelimit variables it was mapped from ("RUNTIME_ROOT,
// RUNTIME_SUBDIRECTORY"). A flag absent has its default. Messages about a
// setting name its source, so that the remedy is the right one: drop a
// flag, unset a variable.
type sources map[string]string

// set records that flag name was set by from.
func (s *sources) set(name, from string) {
	if *s == nil {
		*s = sources{}
	}
	(*s)[name] = from
}

// of returns where flag name came from: its source, or --name when it
// was not recorded (the caller's own setting).
func (s sources) of(name string) string {
	if from := s[name]; from != "" {
		return from
	}
	return "--" + name
}

// undo says what to do so that flag name is no longer set: drop the flag,
// or unset the variables it came from.
func (s sources) undo(name string) string {
	from := s.of(name)
	if strings.HasPrefix(from, "--") {
		return "drop " + from
	}
	return "unset " + strings.TrimSuffix(from, "=GRPC_XDS_SOTW")
}

// recordArgs records the flags args sets, parsing args (which fs has
// parsed already) again into a flag set of the same names that only notes
// which are set, so that it reads them exactly as fs did.
func (s *sources) recordArgs(fs *flag.FlagSet, args []string) {
	shadow := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	shadow.SetOutput(io.Discard)
	fs.VisitAll(func(f *flag.Flag) {
		b, ok := f.Value.(interface{ IsBoolFlag() bool })
		shadow.Var(&noted{name: f.Name, bool: ok && b.IsBoolFlag(), s: s}, f.Name, "")
	})
	shadow.Parse(args)
}

// noted is a flag value that records that it was set.
type noted struct {
	name string
	bool bool
	s    *sources
}

func (n *noted) String() string   { return "" }
func (n *noted) IsBoolFlag() bool { return n.bool }
func (n *noted) Set(string) error { n.s.set(n.name, "--"+n.name); return nil }

// blame adds to each line of err that begins with a flag (--name ...)
// the variable that set it, when one did: "--max-keys must be at least 1
// (--max-keys is CHARON_MAX_KEYS)", so that the user knows what to change.
func (s sources) blame(err error) string {
	lines := strings.Split(err.Error(), "\n")
	for i, l := range lines {
		name, ok := strings.CutPrefix(l, "--")
		if !ok || strings.Contains(l, " set by ") {
			continue
		}
		if end := strings.IndexFunc(name, func(r rune) bool { return !(r == '-' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9') }); end >= 0 {
			name = name[:end]
		}
		if from := s.of(name); !strings.HasPrefix(from, "--") {
			lines[i] = fmt.Sprintf("%s (--%s is %s)", l, name, from)
		}
	}
	return strings.Join(lines, "\n")
}

// configSources is the error of a configuration directory and an xDS
// server both set: each with where it came from, and what to change for
// either.
func (c *serveConfig) configSources() error {
	dir, xds := c.from.of("config"), c.from.of("config-xds")
	toXDS := c.from.undo("config")
	if strings.HasPrefix(dir, "RUNTIME_") {
		// envoyproxy/ratelimit's own way: its directory variables have no
		// effect with CONFIG_TYPE=GRPC_XDS_SOTW.
		toXDS += " (envoyproxy/ratelimit's directory variables) or set CONFIG_TYPE=GRPC_XDS_SOTW"
	}
	return fmt.Errorf("--config and --config-xds: the configuration comes from one source, a directory or an xDS server, "+
		"but the directory %s is set by %s and the xDS server %s by %s: to take the configuration from xDS, %s; to serve the directory, %s",
		c.ConfigDir, dir, c.XDS.Addr, xds, toXDS, c.from.undo("config-xds"))
}

// waitingFor says, for health and UNAVAILABLE answers before the first
// configuration from xDS, where it is awaited from (and which setting
// says so) and what to do meanwhile.
func (c *serveConfig) waitingFor() string {
	force := "--config-xds-force-start"
	if strings.HasPrefix(c.from.of("config-xds"), "CONFIG_") {
		force = "FORCE_START_WITHOUT_INITIAL_CONFIG=true (--config-xds-force-start)"
	}
	return fmt.Sprintf("waiting for the first from the xDS server %s (set by %s, node id %q): check that it is reachable and has a snapshot for this node, "+
		"or start with %s to serve every request OK until it comes", c.XDS.Addr, c.from.of("config-xds"), c.XDS.NodeID, force)
}
