package config

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/charonlimit/charon/descriptors"
)

// ErrInvalid is matched (errors.Is) by every problem Load reports.
var ErrInvalid = errors.New("config: invalid configuration")

// Options are the loader's settings. The zero value loads like
// envoyproxy/ratelimit with default settings.
type Options struct {
	// MergeDomains merges files that share a domain (envoyproxy/ratelimit's
	// MERGE_DOMAIN_CONFIG) instead of refusing them.
	MergeDomains bool
	// FixedWindowDefault makes rate_limit {unit, requests_per_unit} use the
	// calendar-aligned fixed window unless the leaf says
	// algorithm: sliding_window.
	FixedWindowDefault bool
	// OverdraftDefault makes every limit count post-paid usage
	// (tiers.Policy.Overdraft) unless its descriptor says overdraft: false:
	// a configuration that cannot say it (envoyproxy/ratelimit's YAML, xDS)
	// then counts as envoyproxy/ratelimit does by default.
	OverdraftDefault bool
	// Generated says the files were written by a program (the xDS client,
	// one per resource): a limit names its file, the resource, with no line.
	Generated bool
	// CalendarUnits, when set, makes a rate_limit's unit day, week, month
	// or year a calendar period of that zone's clock (tiers.Unit.
	// CalendarPeriod: counted as a quota of that period is, a month from
	// the 1st), in either algorithm, unless a file says otherwise
	// (calendar_units: ZONE or off). nil: envoyproxy/ratelimit's fixed
	// lengths (a month is 30 days).
	CalendarUnits *time.Location
	// Escrow is the server's --escrow (escrow for every rule whose
	// descriptor does not say) and EscrowLease its lease length: a rule
	// asked to be leased that cannot be (tiers.CanLease) is loaded with a
	// warning, and stays on the shared store.
	Escrow      bool
	EscrowLease time.Duration
}

// Warning is a problem that does not stop loading (a normalization, a lowered
// copy limit). String gives "file:line: path: message".
type Warning struct {
	File    string
	Line    int
	Path    string
	Message string
}

func (w Warning) String() string { return format(w.File, w.Line, w.Path, w.Message) }

// Error is one problem that makes a configuration invalid. Its text is
// "file:line: path: message"; it matches ErrInvalid.
type Error struct {
	File    string
	Line    int
	Path    string
	Message string
}

func (e *Error) Error() string { return format(e.File, e.Line, e.Path, e.Message) }

// Is reports whether target is ErrInvalid.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

func format(file string, line int, path, msg string) string {
	var b strings.Builder
	b.WriteString(file)
	if line > 0 {
		fmt.Fprintf(&b, ":%d", line)
	}
	b.WriteString(": ")
	if path != "" {
		b.WriteString(path)
		b.WriteString(": ")
	}
	b.WriteString(msg)
	return b.String()
}

// Config is a loaded, validated, normalized and immutable configuration.
// Safe for concurrent reads.
type Config struct {
	Tree *descriptors.Tree
	// Files are the files loaded, in load order (sorted paths of fsys).
	Files []string
}

// Load reads every regular file of fsys as YAML, whatever its name ends
// with, recursively, skipping names that start with "." (so a Kubernetes
// ConfigMap mount, whose "..data" and "..<timestamp>" directories hold the
// files that top-level symlinks point to, loads each file once, through its
// symlink). envoyproxy/ratelimit reads every file of its directory as YAML
// too, so a file that is not YAML, or not a domain, is an error rather than
// a domain silently missing. It validates and normalizes them in one pass.
// The error joins every problem found (errors.Join of *Error, one per
// problem, sorted by file and line); the warnings are returned even when the
// error is not nil.
func Load(fsys fs.FS, opts Options) (*Config, []Warning, error) {
	files, err := listFiles(fsys)
	if err != nil {
		return nil, nil, errors.Join(&Error{File: ".", Message: "listing files: " + err.Error()})
	}
	st := &state{opts: opts}
	parsers := make([]*parser, len(files))
	results := make([]*fileConfig, len(files))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(files)) {
		wg.Go(func() {
			for i := range next {
				p := &parser{opts: opts, file: files[i], calendar: opts.CalendarUnits}
				parsers[i] = p
				data, err := fs.ReadFile(fsys, files[i])
				if err != nil {
					p.errs = append(p.errs, &Error{File: files[i], Message: "reading: " + err.Error()})
					continue
				}
				results[i] = p.parseFile(data)
			}
		})
	}
	for i := range files {
		next <- i
	}
	close(next)
	wg.Wait()
	var parsed []*fileConfig
	for i, p := range parsers {
		st.errs = append(st.errs, p.errs...)
		st.warns = append(st.warns, p.warns...)
		if results[i] != nil {
			parsed = append(parsed, results[i])
		}
	}
	specs := st.merge(parsed)
	var tree *descriptors.Tree
	if len(st.errs) == 0 {
		tree, err = descriptors.NewTree(specs)
		if err != nil {
			st.errs = append(st.errs, &Error{File: ".", Message: err.Error()})
		}
	}
	sortProblems(st.errs, st.warns)
	if len(st.errs) > 0 {
		errs := make([]error, len(st.errs))
		for i, e := range st.errs {
			errs[i] = e
		}
		return nil, st.warns, errors.Join(errs...)
	}
	return &Config{Tree: tree, Files: files}, st.warns, nil
}

func sortProblems(errs []*Error, warns []Warning) {
	slices.SortStableFunc(errs, func(a, b *Error) int {
		return cmp.Or(strings.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line))
	})
	slices.SortStableFunc(warns, func(a, b Warning) int {
		return cmp.Or(strings.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line))
	})
}

// listFiles walks fsys for the files to load: every regular file not
// hidden by a leading ".". A symlink is followed when it names a regular
// file (fs.Stat), never into a directory, so link loops cannot recur.
func listFiles(fsys fs.FS) ([]string, error) {
	var files []string
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if p != "." && strings.HasPrefix(name, ".") {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		if d.Type()&fs.ModeSymlink != 0 {
			fi, err := fs.Stat(fsys, p)
			if err != nil || !fi.Mode().IsRegular() {
				return nil
			}
		} else if !d.Type().IsRegular() {
			return nil
		}
		files = append(files, p)
		return nil
	})
	slices.Sort(files)
	return files, err
}

// Problems splits an error of Load into its problems, one per file:line;
// any other error is one problem.
func Problems(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
