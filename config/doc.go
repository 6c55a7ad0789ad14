// Package config loads a directory of envoyproxy/ratelimit-style YAML files
// (with Charon's extensions) into a validated, normalized, immutable
// descriptors.Tree. It is pure: it never logs and never watches; the server
// watches the directory and swaps the result in.
//
// Load reads every regular file under the root of an fs.FS as YAML,
// whatever its name ends with (as envoyproxy/ratelimit reads every file of
// its directory), recursively, skipping names that start with "."
// (Kubernetes ConfigMap internals, editors' and tools' hidden files). So a
// file that is not a domain's YAML is an error, not a file left out. One
// file holds one RLS domain; two files with one domain are an error unless
// Options.MergeDomains. Decoding is strict: an unknown key, a key given
// twice in one mapping, a non-string key, a value of the wrong type or a
// second YAML document is an error, and every problem of every file is
// reported at once, each as "file:line: path: message", e.g.
//
//	api.yaml:14: descriptors[2].tiers[0].window: must be > 0
//
// Values are read as envoyproxy/ratelimit's decoder, yaml.v2, reads them
// (YAML 1.1): a flag is true, yes, on or y, or false, no, off or n (also
// capitalized or in capitals), and empty is false; an empty rate_limit is
// none, an empty requests_per_unit 0 (with a warning), an empty metadata
// none. Merge keys (<<: *anchor, or a list of anchors) are expanded as
// yaml.v2 expands them: keys after a merge override it, of a list of
// mappings the first wins, a mapping value given again (rate_limit,
// metadata) is merged key by key, and a key before a merge that gives it
// too is replaced, with a warning. Problems in merged keys are reported at
// the lines where they are written, with the path where they are used.
//
// # Keys
//
// Per file: domain, descriptors, and Charon's ignore_limits (kill switch:
// grant everything, still record) and allow_unconfigured (grant and record
// requests that match no descriptor). Merged files set either when any of
// them does.
//
// Per descriptor, as envoyproxy/ratelimit: key, value (containing "*": a
// wildcard), rate_limit {unit, requests_per_unit, unlimited, name,
// replaces: [{name}]}, shadow_mode, quota_mode, detailed_metric,
// value_to_metric, share_threshold, descriptors, metadata (returned to
// Envoy as envoyproxy/ratelimit returns it: YAML 1.1 scalars, a date kept
// as text, keys of nested mappings written out as their values print, so
// 429 becomes "429"). Units are second, minute, hour, day, week, month and
// year, in any case. rate_limit resolves to one tier of limit
// requests_per_unit, window one unit (a month is 30 days, a year 365),
// active unbounded, cooldown 0: an exact sliding window.
// rate_limit.algorithm: fixed_window (or Options.FixedWindowDefault) gives
// envoyproxy/ratelimit's calendar-aligned fixed window instead; algorithm:
// sliding_window the default. requests_per_unit: 0 rejects every request.
//
// Charon's extensions on a descriptor (SPEC §3):
//
//	tiers: [{limit, window, active, cooldown, skippable}]
//	    limit >= 1 and window > 0 are required; active defaults to
//	    unbounded, cooldown to 0, skippable to false. An empty list
//	    rejects every request.
//	hard_limit, global_limit: hits per second per domain / over all
//	    domains (>= 1; leave out for none), with tiers or a sliding
//	    rate_limit.
//	token_bucket: {capacity, refill, per}
//	concurrency: {limit, ttl}
//	    a concurrency limit (tiers.Policy.Concurrency): at most limit
//	    slots held at once, each given back by a refund or freed ttl after
//	    it was taken; limit >= 1 and ttl > 0 are required. It takes no
//	    hard_limit, global_limit, overdraft, pace or quota, and its
//	    overrides give concurrency blocks (an override of another policy
//	    gives none).
//	copies: {domain_limit, global_limit, groups: [{name, limit, members}]}
//	overrides: [{domain, rate_limit | tiers | token_bucket | concurrency,
//	    hard_limit}] or, for copies, [{domain, domain_limit}].
//
// A descriptor has at most one policy (rate_limit, tiers, token_bucket,
// concurrency or copies). An override replaces the default policy for its Charon domain
// entirely (hard_limit included) but keeps the resource's global_limit. An
// override's domain and a group's members are written as the raw request
// values joined by "," (they are escaped as descriptors.Match.Domain is).
// Durations are Go durations ("1s", "5m", "24h") or "unbounded".
//
// # Normalization
//
// As the paper §4.1 and SPEC §2 say, with a Warning naming file and line: a
// tier with active 0 is removed; a window longer than its active period is
// cut to it; an active period that is not a multiple of its window is cut
// down to one. Copy limits (domain, group, override) above the global limit
// are lowered to it.
//
// # Speed
//
// Files are parsed concurrently, one goroutine per CPU. Each file is decoded
// once by yaml.v3 into a yaml.Node tree, which the loader then walks,
// validating as it goes; errors and their lines are yaml.v3's for invalid
// YAML and the nodes' own for everything else. Positions in error messages
// are written out only for the problems reported.
package config
