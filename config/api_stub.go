package config

import (
	"io/fs"

	"github.com/charonlimit/charon/descriptors"
)

// This file fixes the package's surface while it is being written; its
// declarations move to their own files.

// Options are the loader's settings. The zero value loads like
// envoyproxy/ratelimit with default settings.
type Options struct {
	// MergeDomains merges files that share a domain (envoyproxy/ratelimit's
	// MERGE_DOMAIN_CONFIG) instead of refusing them.
	MergeDomains bool
	// FixedWindowDefault makes rate_limit {unit, requests_per_unit} use the
	// calendar-aligned fixed window unless the leaf says algorithm: sliding.
	FixedWindowDefault bool
}

// Warning is a problem that does not stop loading (a normalization, a lowered
// copy limit). String gives "file:line: path: message".
type Warning struct {
	File    string
	Line    int
	Path    string
	Message string
}

func (w Warning) String() string { return "" }

// Config is a loaded, validated, normalized and immutable configuration.
type Config struct {
	Tree *descriptors.Tree
}

// Load reads every YAML file of fsys, validates and normalizes them. The
// error joins every problem found, each "file:line: path: message".
func Load(fsys fs.FS, opts Options) (*Config, []Warning, error) { return nil, nil, nil }

// Dump renders the resolved tree (resources and effective policies) as YAML.
func (c *Config) Dump() ([]byte, error) { return nil, nil }
