package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/charonlimit/charon/config"
	"github.com/charonlimit/charon/internal/canary"
	"github.com/charonlimit/charon/internal/clientcmd"
	"github.com/charonlimit/charon/internal/copystore/memcopy"
	"github.com/charonlimit/charon/internal/decisionlog"
	"github.com/charonlimit/charon/internal/engine"
	"github.com/charonlimit/charon/internal/escrow"
	"github.com/charonlimit/charon/internal/gctune"
	"github.com/charonlimit/charon/internal/holds"
	"github.com/charonlimit/charon/internal/lyftenv"
	"github.com/charonlimit/charon/internal/memlimit"
	"github.com/charonlimit/charon/internal/offlinecmd"
	"github.com/charonlimit/charon/internal/redisbackend"
	"github.com/charonlimit/charon/internal/redisconn"
	"github.com/charonlimit/charon/internal/rlqs"
	"github.com/charonlimit/charon/internal/sharestore"
	"github.com/charonlimit/charon/internal/statefile"
	"github.com/charonlimit/charon/internal/statsd"
	"github.com/charonlimit/charon/internal/statsmap"
	"github.com/charonlimit/charon/internal/store/memstore"
	"github.com/charonlimit/charon/internal/store/resilient"
	"github.com/charonlimit/charon/internal/tracing"
	"github.com/charonlimit/charon/internal/xdsconfig"
	"github.com/charonlimit/charon/server"
	"github.com/charonlimit/charon/service/charon"
	rlqsservice "github.com/charonlimit/charon/service/rlqs"
	"github.com/charonlimit/charon/service/rls"
)

// serveConfig is everything `charon serve` is told, after defaults,
// envoyproxy/ratelimit's environment, CHARON_* variables and flags, in rising
// precedence. Each package binds and checks its own flags.
type serveConfig struct {
	ConfigDir string
	// CandidateConfig, when set, is a configuration directory decided in
	// shadow beside the live one (package canary), reloaded like it.
	CandidateConfig string
	// XDS, with its Addr set, takes the configuration from an xDS server
	// instead of ConfigDir.
	XDS    xdsconfig.Flags
	Store  string
	Server server.Flags
	// RLS and Charon are the services' settings (service/rls,
	// service/charon), bound to their flags directly.
	RLS    rls.Options
	Charon charon.Options
	// Redis are the Redis flags; the password comes from a file,
	// CHARON_REDIS_PASSWORD or REDIS_AUTH (never a flag, which ps would
	// show).
	Redis     redisbackend.Flags
	Tracing   tracing.Flags
	Decisions decisionlog.Flags
	RLQS      rlqs.Flags
	// Escrow decides hot keys from escrow leases (with --store redis).
	Escrow escrow.Flags
	// Load are the settings that change how a configuration loads.
	Load config.Options
	// MetricsMapping names a statsd_exporter mapping file to make
	// envoyproxy/ratelimit's series from its statsd stats (in place of
	// RLS.LyftMetrics' names); Statsd, with its Addr set, sends its statsd
	// stats there.
	MetricsMapping string
	Statsd         statsd.Options
	MaxDescriptors int
	// PaceMaxWaiting bounds the requests pacing holds at once.
	PaceMaxWaiting int
	MaxKeys        int
	// StateFile, with the memory store, keeps its states across restarts
	// (package statefile), snapshotted every StateInterval.
	StateFile               string
	StateInterval           time.Duration
	StateFileDiscardInvalid bool
	QuotaMode               bool
	HeapFloorMiB            int
	// CgroupRoot is where the container's memory limit is read from
	// (package memlimit): CHARON_CGROUP_ROOT, an environment variable
	// only, for tests and unusual mounts; MaxKeys and HeapFloorMiB are derived from it
	// unless set (MaxKeysSet, HeapFloorSet), and GOMEMLIMIT unless the
	// environment sets it (GoMemLimitSet).
	CgroupRoot                              string
	MaxKeysSet, HeapFloorSet, GoMemLimitSet bool
	LogLevel                                string
	LogFormat                               string

	// from is where each flag set got its value, for messages.
	from sources
}

// defaultConfigDir is the default of --config: empty (no configuration,
// every request OK) unless the build sets it with -ldflags "-X
// main.defaultConfigDir=DIR", as the image's build does for the examples
// it carries. Being the default, it has the lowest precedence: --config,
// CHARON_CONFIG and envoyproxy/ratelimit's RUNTIME_* variables all replace
// it, so a migrated Deployment serves its own directory, not the image's.
var defaultConfigDir = ""

func defaultServeConfig() serveConfig {
	return serveConfig{
		ConfigDir:      defaultConfigDir,
		XDS:            xdsconfig.DefaultFlags(),
		Store:          "memory",
		Server:         server.DefaultFlags(),
		RLS:            rls.DefaultOptions(),
		Redis:          redisbackend.Flags{Options: redisbackend.Options{Timeout: resilient.DefaultTimeout}},
		Tracing:        tracing.DefaultFlags(),
		Decisions:      decisionlog.DefaultFlags(),
		RLQS:           rlqs.DefaultFlags(),
		Escrow:         escrow.DefaultFlags(),
		Statsd:         statsd.Options{FlushInterval: time.Second},
		MaxDescriptors: 64,
		PaceMaxWaiting: engine.DefaultPaceMaxWaiting,
		MaxKeys:        memstore.DefaultMaxKeys,
		StateInterval:  10 * time.Second,
		HeapFloorMiB:   gctune.DefaultFloorMiB,
		CgroupRoot:     memlimit.DefaultRoot,
		LogLevel:       "info",
		LogFormat:      "json",
	}
}

// serveFlags declares serve's flags on fs with c's values as defaults, so
// parsing overrides only what is given.
func serveFlags(fs *flag.FlagSet, c *serveConfig) {
	fs.StringVar(&c.ConfigDir, "config", c.ConfigDir, "configuration `directory` (watched)")
	fs.StringVar(&c.CandidateConfig, "candidate-config", c.CandidateConfig, "a candidate configuration `directory` (watched): every request is decided under it too, in shadow against its own in-memory state, never changing an answer; agreement per rule in metrics, GET /candidate and charon explain --candidate")
	c.XDS.Bind(fs)
	fs.StringVar(&c.Store, "store", c.Store, "state store: memory or redis")
	c.Server.Bind(fs)
	c.RLS.Bind(fs)
	c.Charon.Bind(fs)
	c.Redis.Bind(fs)
	c.Tracing.Bind(fs)
	c.Decisions.Bind(fs)
	c.RLQS.Bind(fs)
	c.Escrow.Bind(fs)
	fs.StringVar(&c.MetricsMapping, "metrics-mapping", c.MetricsMapping, "make Prometheus series of envoyproxy/ratelimit's statsd stats with this statsd_exporter mapping `file`, as its PROMETHEUS_MAPPER_YAML does, in place of --lyft-metrics' built-in names")
	c.Statsd.Bind(fs)
	fs.IntVar(&c.MaxDescriptors, "max-descriptors", c.MaxDescriptors, "most descriptors in one request")
	fs.IntVar(&c.PaceMaxWaiting, "pace-max-waiting", c.PaceMaxWaiting, "most requests held at once by pace: (a descriptor's wait instead of a rejection); beyond, a request is rejected as without pace; 0: pacing off")
	fs.IntVar(&c.MaxKeys, "max-keys", c.MaxKeys, "most tracked (resource, domain) pairs in memory, least recently used evicted; unset: as many as fit in half the memory limit (GOMEMLIMIT, or 90% of the container's), this default without one")
	fs.StringVar(&c.StateFile, "state-file", c.StateFile, "with --store memory, keep the counts across restarts in this `file`: restored at start, written at shutdown, every --state-interval and on SIGUSR1")
	fs.DurationVar(&c.StateInterval, "state-interval", c.StateInterval, "how often --state-file is written: a crash loses at most this long of counts")
	fs.BoolVar(&c.StateFileDiscardInvalid, "state-file-discard-invalid", c.StateFileDiscardInvalid, "start with empty state, with a warning, when --state-file is corrupt, truncated or not a state file (else charon refuses to start)")
	fs.BoolVar(&c.QuotaMode, "quota-mode", c.QuotaMode, "every limit in quota mode: a descriptor over its limit is OVER_LIMIT, the request only when all its descriptors are")
	c.Load.Bind(fs)
	fs.IntVar(&c.HeapFloorMiB, "heap-floor-mib", c.HeapFloorMiB, "the garbage collector's heap goal is at least this many MiB while the live heap is small; 0: Go's default; unset: half the memory limit (GOMEMLIMIT, or 90% of the container's) up to this default, "+strconv.Itoa(memlimit.UnlimitedFloorMiB)+" without one")
	envUsage(fs)
}

// envUsage names in each flag's usage its CHARON_<FLAG> variable, by which
// it can be set (applyCharonEnv).
func envUsage(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.Contains(f.Usage, "(env ") {
			f.Usage += " (env " + envName(f.Name) + ")"
		}
	})
}

// loadFlags are the offline verbs' flags that change how a configuration
// loads, with serve's values from the environment as defaults, so that
// they load as serve would (offlinecmd.LoadFlags).
func loadFlags(getenv func(string) string) offlinecmd.LoadFlags {
	return func(fs *flag.FlagSet, stderr io.Writer) (*config.Options, error) {
		c, _, err := serveEnv(getenv, stderr)
		if err != nil {
			return nil, err
		}
		own := flag.NewFlagSet("", flag.ContinueOnError)
		c.Load.Bind(own)
		envUsage(own)
		own.VisitAll(func(f *flag.Flag) { fs.Var(f.Value, f.Name, f.Usage) })
		return &c.Load, nil
	}
}

func envName(flagName string) string {
	return "CHARON_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applyCharonEnv applies CHARON_<FLAG> variables by setting the flags
// themselves, so they are parsed exactly like the flags.
func applyCharonEnv(fs *flag.FlagSet, getenv func(string) string, from *sources) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		name := envName(f.Name)
		if v := getenv(name); v != "" && err == nil {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%w: %s=%q: %v", clientcmd.ErrUsage, name, v, e)
			}
			from.set(f.Name, name)
		}
	})
	return err
}

// serveEnv returns serve's defaults overridden by envoyproxy/ratelimit's
// environment and then by CHARON_* variables, with serve's flag set bound to
// it for the command line to override last. config check starts from it
// too, so that it loads exactly as serve would.
func serveEnv(getenv func(string) string, stderr io.Writer) (*serveConfig, *flag.FlagSet, error) {
	c := defaultServeConfig()
	lyft, err := lyftenv.Read(getenv)
	if err != nil {
		return &c, nil, fmt.Errorf("%w: %v", clientcmd.ErrUsage, err)
	}
	c.Redis.Username, c.Redis.Password = lyft.RedisUsername, lyft.RedisPassword
	if p := getenv("CHARON_REDIS_PASSWORD"); p != "" {
		c.Redis.Password = p
	}
	c.LogLevel = cmp.Or(lyft.LogLevel, c.LogLevel)
	c.LogFormat = cmp.Or(lyft.LogFormat, c.LogFormat)
	fs := clientcmd.FlagSet("serve", stderr)
	serveFlags(fs, &c)
	for _, f := range lyft.Flags {
		if err := fs.Set(f.Name, f.Value); err != nil {
			return &c, nil, fmt.Errorf("%w: %s: %v", clientcmd.ErrUsage, f.From, err)
		}
		c.from.set(f.Name, f.From)
	}
	if err := applyCharonEnv(fs, getenv, &c.from); err != nil {
		return &c, nil, err
	}
	return &c, fs, nil
}

// parseServe resolves serve's configuration from args and the environment.
func parseServe(args []string, getenv func(string) string, stderr io.Writer) (serveConfig, error) {
	c, fs, err := serveEnv(getenv, stderr)
	if err != nil {
		return *c, err
	}
	if err := clientcmd.ParseFlags(fs, args); err != nil {
		return *c, err
	}
	c.from.recordArgs(fs, args)
	// The build's default directory (the image's examples) gives way to
	// xDS; a directory asked for does not (check refuses both).
	if c.XDS.On() && !flagSet(fs, "config") {
		c.ConfigDir = ""
	}
	c.MaxKeysSet, c.HeapFloorSet = flagSet(fs, "max-keys"), flagSet(fs, "heap-floor-mib")
	c.GoMemLimitSet = getenv("GOMEMLIMIT") != ""
	c.CgroupRoot = cmp.Or(getenv("CHARON_CGROUP_ROOT"), c.CgroupRoot)
	if err := c.check(); err != nil {
		return *c, fmt.Errorf("%w: %s", clientcmd.ErrUsage, c.from.blame(err))
	}
	return *c, nil
}

// memoryBudget reads the container's memory limit under c.CgroupRoot (self
// is the process's /proc/self/cgroup) and derives the budget with the soft
// limit in force, goLimit; it sets MaxKeys and HeapFloorMiB from it unless
// they were set. A limit file it cannot read is reported in err, and the
// budget is derived as without a container limit.
func (c *serveConfig) memoryBudget(self string, goLimit int64) (memlimit.Budget, error) {
	container, err := memlimit.Container(c.CgroupRoot, self)
	b := memlimit.Plan(container, goLimit, c.GoMemLimitSet)
	if !c.HeapFloorSet {
		c.HeapFloorMiB = b.FloorMiB
	}
	if !c.MaxKeysSet {
		c.MaxKeys = memstore.KeysFor(b.KeysHeap())
	}
	return b, err
}

// flagSet reports whether the flag name was set (by the command line, a
// CHARON_* variable or envoyproxy/ratelimit's environment).
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// check refuses settings that cannot work, naming the flag.
func (c *serveConfig) check() error {
	if c.XDS.On() && c.ConfigDir != "" {
		return c.configSources()
	}
	switch c.Store {
	case "memory":
	case "redis":
		bo, err := c.Redis.Resolve()
		if err != nil {
			return err
		}
		if c.Escrow.Home != "" {
			bo.Conn.URL = c.Escrow.Home
			if err := redisbackend.Check(bo); err != nil {
				return fmt.Errorf("--escrow-home: %v", err)
			}
		}
	default:
		return fmt.Errorf("--store %q: want memory or redis", c.Store)
	}
	var errs []error
	for _, check := range []func() error{c.Server.Check, c.RLS.Check, c.Tracing.Check, c.Decisions.Check, c.XDS.Check, c.RLQS.Check, c.Statsd.Check, c.Escrow.Check} {
		errs = append(errs, check())
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	switch {
	case c.MaxDescriptors < 1:
		return errors.New("--max-descriptors must be at least 1")
	case c.PaceMaxWaiting < 0:
		return errors.New("--pace-max-waiting must be at least 0 (0: pacing off)")
	case c.MaxKeys < 1:
		return errors.New("--max-keys must be at least 1")
	case c.Escrow.Home != "" && c.Store != "redis":
		return errors.New("--escrow-home: a region's replicas keep its slices in its Redis: want --store redis")
	case c.StateFile != "" && c.Store != "memory":
		return fmt.Errorf("--state-file keeps the memory store's counts: --store %s keeps its own", c.Store)
	case c.StateInterval <= 0:
		return errors.New("--state-interval must be positive")
	case c.HeapFloorMiB < 0 || c.HeapFloorMiB > 1<<20:
		return fmt.Errorf("--heap-floor-mib %d: want 0 to 1048576", c.HeapFloorMiB)
	case c.LogFormat != "json" && c.LogFormat != "text":
		return fmt.Errorf("LOG_FORMAT %q: want json or text", c.LogFormat)
	}
	_, err := parseLevel(c.LogLevel)
	return err
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return l, fmt.Errorf("LOG_LEVEL %q: want debug, info, warn or error", s)
	}
	return l, nil
}

func newLogger(level, format string, w io.Writer) *slog.Logger {
	l, _ := parseLevel(level)
	opts := &slog.HandlerOptions{Level: l}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

func runServe(args []string, getenv func(string) string, stderr io.Writer) error {
	c, err := parseServe(args, getenv, stderr)
	if err != nil {
		return err
	}
	log := newLogger(c.LogLevel, c.LogFormat, stderr)
	if err := serve(c, args, log); err != nil {
		log.Error("cannot start", "err", err.Error())
		return clientcmd.ErrReported
	}
	return nil
}

// serve wires the packages together from c and serves until a signal.
func serve(c serveConfig, args []string, log *slog.Logger) error {
	var done cleanup // run in reverse once Serve has returned
	defer done.run()
	done.add(c.useMemory(log))
	if c.Tracing.On {
		tp, err := tracing.New(context.Background(), c.Tracing.Options)
		if err != nil {
			return fmt.Errorf("--tracing: %v", err)
		}
		done.add(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tp.Shutdown(ctx); err != nil {
				log.Warn("sending the last traces", "err", err.Error())
			}
		})
	}
	opts, err := c.Server.Resolve(log)
	if err != nil {
		return err
	}
	opts.ConfigDir, opts.Logger, opts.Tracing, opts.Load = c.ConfigDir, log, c.Tracing.On, c.loader(false)
	opts.WaitForConfig, opts.WaitingFor = c.XDS.On() && !c.XDS.ForceStart, c.waitingFor()
	eo, ho, backend, err := c.openStores(args, log, &opts, &done)
	if err != nil {
		return err
	}
	eng := engine.New(eo)
	opts.Engine, ho.Tree = eng, eng.Tree
	rlsOpts, charonOpts := c.RLS, c.Charon
	charonOpts.Holds = ho.Held
	if err := c.openSinks(&rlsOpts, log, &done); err != nil {
		return err
	}
	if c.CandidateConfig != "" {
		cand := canary.New(canary.Options{Engine: eo, MaxKeys: c.MaxKeys})
		done.add(func() { cand.Close() })
		watch := server.NewReloader(c.CandidateConfig, opts.Load, cand.SetConfig, server.NewMetrics(nil), log.With("config", "candidate"))
		if _, err := watch.Check(); err != nil {
			return fmt.Errorf("--candidate-config %s: %v", c.CandidateConfig, err)
		}
		// Watched, and stopped before the canary closes, by the server.
		rlsOpts.Candidate, rlsOpts.CandidateWatch, charonOpts.Candidate = cand, watch, cand
	}
	services := []server.Service{rls.New(eng, rlsOpts), charon.New(eng, holds.New(ho.Options), charonOpts)}
	if c.RLQS.On {
		quota, err := c.rlqsService(backend, eng, log)
		if err != nil {
			return err
		}
		services = append(services, quota)
	}
	if c.ConfigDir == "" && !c.XDS.On() {
		log.Warn("no --config directory: serving with no configuration, every request is OK")
	}
	srv, err := server.New(opts, services...)
	if err != nil {
		return err
	}
	ctx, stop := srv.StopOnSignal()
	defer stop()
	if c.XDS.On() {
		stopXDS, err := c.startXDS(ctx, srv, log)
		if err != nil {
			return err
		}
		defer stopXDS()
	}
	if backend != nil {
		defer backend.Run(ctx, srv.SetServing)()
	}
	if err := srv.Serve(ctx); err != nil {
		return fmt.Errorf("serving: %v", err)
	}
	return nil
}

// rlqsService is the RLQS service on eng's tree, over the share store:
// Redis's, or one in memory.
func (c *serveConfig) rlqsService(backend *redisbackend.Backend, eng *engine.Engine, log *slog.Logger) (server.Service, error) {
	var shares sharestore.Store = &sharestore.Memory{}
	if backend != nil {
		shares = backend.Shares()
	}
	ro := c.RLQS.Options(shares, eng.Tree, log)
	if backend == nil && c.RLQS.RestartHold {
		// The memory store starts empty: let the assignments of a
		// previous process run out first.
		ro.Hold = c.RLQS.TTL
	}
	alloc, err := rlqs.New(ro)
	if err != nil {
		return nil, err
	}
	return rlqsservice.New(alloc), nil
}

// startXDS runs the xDS client that hands srv its configurations until
// ctx ends; stop ends it and waits for it.
func (c *serveConfig) startXDS(ctx context.Context, srv *server.Server, log *slog.Logger) (stop func(), err error) {
	xo := c.XDS.Options()
	xo.Logger, xo.Load = log, c.loader(true)
	xo.Apply = func(cfg *config.Config, version string) { srv.ApplyConfig(cfg, "xds", version) }
	xo.Rejected = func(string, error) { srv.ConfigRejected() }
	xc, err := xdsconfig.New(xo)
	if err != nil {
		return nil, err
	}
	log.Info("config", "source", "xds", "server", c.XDS.Addr, "node_id", c.XDS.NodeID, "tls", c.XDS.TLS.On(), "force_start", c.XDS.ForceStart)
	ctx, cancel := context.WithCancel(ctx)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		xc.Run(ctx)
	}()
	return func() {
		cancel()
		<-exited
	}, nil
}

// cleanup is what to close once serve is done, in reverse order.
type cleanup []func()

func (c *cleanup) add(f func()) { *c = append(*c, f) }

func (c *cleanup) run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
}

// loader loads a configuration directory with c's settings; generated
// says its files were written by a program (the xDS client): a rule is
// named by its resource, not by a line of them.
func (c *serveConfig) loader(generated bool) server.LoadFunc {
	lo := c.Load
	lo.Generated = generated
	if c.Store == "redis" {
		// Which rules escrow may lease is said at load.
		lo.Escrow, lo.EscrowLease = c.Escrow.Options.Default, c.Escrow.Options.Lease
	}
	return func(fsys fs.FS) (*config.Config, []config.Warning, error) { return config.Load(fsys, lo) }
}

// useMemory sizes the process to the container's memory limit (GOMEMLIMIT,
// the heap floor, --max-keys unless set) and returns what undoes the
// floor.
func (c *serveConfig) useMemory(log *slog.Logger) func() {
	self, _ := os.ReadFile("/proc/self/cgroup") // none off Linux: no container limit
	budget, err := c.memoryBudget(string(self), debug.SetMemoryLimit(-1))
	if err != nil {
		log.Warn("reading the container's memory limit", "err", err.Error())
	}
	budget.Apply()
	log.Info("memory", "container_limit_bytes", budget.Container, "go_memory_limit_bytes", budget.GoLimit, "go_memory_limit_from", budget.GoLimitFrom,
		"heap_floor_mib", c.HeapFloorMiB, "max_keys", c.MaxKeys)
	return gctune.Floor(uint64(c.HeapFloorMiB) << 20).Stop
}

// copyHolds are the copy operations' options and the gauge of the copies
// held in the store.
type copyHolds struct {
	holds.Options
	Held func() float64
}

// openStores opens the stores of --store (Redis, or memory with its state
// file and copy store), sets opts' metrics to export them, and adds their
// closing to done. It returns the engine's options on the rate store and
// the copy operations' on the copy store, and the Redis backend (nil in
// memory).
func (c *serveConfig) openStores(args []string, log *slog.Logger, opts *server.Options, done *cleanup) (engine.Options, copyHolds, *redisbackend.Backend, error) {
	eo := engine.Options{MaxDescriptors: c.MaxDescriptors, QuotaMode: c.QuotaMode, FixedWindowOverrides: c.Load.FixedWindowDefault, Overdraft: c.Load.OverdraftDefault,
		PaceMaxWaiting: c.PaceMaxWaiting}
	if c.PaceMaxWaiting == 0 {
		eo.PaceMaxWaiting = -1
	}
	var ho copyHolds
	local := memstore.Options{MaxKeys: c.MaxKeys, SweepInterval: 10 * time.Second}
	if c.Store == "redis" {
		bo, err := c.Redis.Resolve()
		if err != nil {
			return eo, ho, nil, err
		}
		if u, err := redisconn.ParseURL(c.Redis.URL); err == nil && u.Password != "" &&
			slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, u.Password) }) {
			log.Warn("the Redis password in --redis-url shows in ps and /proc: use --redis-password-file, CHARON_REDIS_PASSWORD or REDIS_AUTH")
		}
		bo.Local, bo.Logger, bo.Tracing = local, log, c.Tracing.On
		backend, err := redisbackend.Open(bo)
		if err != nil {
			return eo, ho, nil, fmt.Errorf("redis store: %v", err)
		}
		done.add(func() { backend.Close() })
		log.Info("store", "kind", "redis", "failure_mode", bo.FailureMode.String(), "timeout", bo.Timeout)
		// With a home (regions), the home decides and holds every budget;
		// the region's Redis keeps its slices and its replicas' shares.
		home, pool := backend, escrow.Pool(nil)
		if c.Escrow.Home != "" {
			hbo := bo
			hbo.Conn.URL = c.Escrow.Home
			if home, err = redisbackend.Open(hbo); err != nil {
				return eo, ho, nil, fmt.Errorf("--escrow-home: %v", err)
			}
			done.add(func() { home.Close() })
			pool = backend.EscrowPool()
			log.Info("escrow region", "region", c.Escrow.Region, "region_lease", c.Escrow.RegionLease)
		}
		eo.Store, eo.OnSetTree, ho.Copies = home.Store(), home.SetTree, home.Copies()
		opts.Metrics = server.NewMetrics(nil)
		home.Register(opts.Metrics.Registry)
		esc, err := c.Escrow.Open(escrow.Wiring{Remote: home.Store(), Leaser: home.Leaser(), Shares: backend.Shares(),
			Pool: pool, SetTree: home.SetTree, Logger: log, Registry: opts.Metrics.Registry})
		if err != nil {
			return eo, ho, nil, err
		}
		done.add(func() { esc.Close() }) // before the backends': it gives back its leases
		eo.Store, eo.OnSetTree = esc, esc.SetTree
		ho.Held = func() float64 { return float64(home.Copies().Stats().Live.Copies) }
		return eo, ho, home, nil
	}
	mem := memstore.New(local)
	done.add(func() { mem.Close() })
	opts.Metrics = server.NewMetrics(func() float64 { return float64(mem.Evictions()) })
	if c.StateFile != "" {
		keeper, err := statefile.Open(mem, statefile.Options{Path: c.StateFile, Interval: c.StateInterval,
			DiscardInvalid: c.StateFileDiscardInvalid, SaveOn: []os.Signal{syscall.SIGUSR1}, Logger: log})
		switch {
		case errors.Is(err, statefile.ErrCorrupt) || errors.Is(err, statefile.ErrForeign) || errors.Is(err, statefile.ErrVersion):
			return eo, ho, nil, fmt.Errorf("--state-file: %v (--state-file-discard-invalid starts empty instead)", err)
		case err != nil:
			return eo, ho, nil, fmt.Errorf("--state-file: %v", err)
		}
		// Run after the server's own: the last snapshot is taken once
		// Serve has returned and nothing more is decided.
		done.add(func() {
			if err := keeper.Close(); err != nil {
				log.Error("state file: the last snapshot failed", "file", c.StateFile, "err", err.Error())
			}
		})
		opts.Metrics.StateFileWrites(keeper.Saved, keeper.Failed)
	}
	mc := memcopy.New(memcopy.Options{SweepInterval: time.Second})
	done.add(func() { mc.Close() })
	opts.Metrics.Registry.MustRegister(mc.Collector())
	eo.Store, ho.Copies = mem, mc
	ho.Held = func() float64 { return float64(mc.Stats().Copies) }
	return eo, ho, nil, nil
}

// openSinks opens what the RLS service writes to (the statsd_exporter
// mapping, statsd, the decision log) into o, and adds their closing to
// done.
func (c *serveConfig) openSinks(o *rls.Options, log *slog.Logger, done *cleanup) error {
	if c.MetricsMapping != "" {
		ms, err := statsmap.Open(c.MetricsMapping, log)
		if err != nil {
			return fmt.Errorf("--metrics-mapping: %v", err)
		}
		done.add(func() { ms.Close() })
		o.MappedStats = ms
	}
	if c.Statsd.Addr != "" {
		so := c.Statsd
		so.Logger = log
		sink, err := statsd.New(so)
		if err != nil {
			return fmt.Errorf("--statsd-addr: %v", err)
		}
		done.add(func() { sink.Close() })
		log.Info("statsd", "addr", so.Addr, "protocol", so.Protocol.String())
		o.Stats = sink
	}
	decisions, err := c.Decisions.Open()
	if decisions != nil {
		done.add(func() { decisions.Close() })
		o.DecisionLog = decisions
	}
	return err
}
