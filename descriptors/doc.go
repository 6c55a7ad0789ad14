// Package descriptors holds the immutable descriptor tree of every RLS domain
// and matches request descriptors against it with envoyproxy/ratelimit's
// rules, resolving each to a (resource, Charon domain, limit) triple.
//
// # Matching
//
// A request descriptor is a list of entries (key, value). Matching walks the
// tree one entry per level. At each level the child with the entry's key and
// exactly its value wins; else the first wildcard child (config order) whose
// pattern matches the value, "*" standing for any run of bytes (a value
// ending in "*" is a prefix match, as in envoyproxy/ratelimit; "*" inside a
// value is also accepted); else the child with the key and no value. The
// limit is that of the node reached by the last entry: a descriptor with
// more entries than the tree is deep, one that leaves the tree, or one ending
// on a node without a limit is not limited.
//
// # Identity
//
// Match.Resource is the escaped RLS domain followed, for each level of the
// matched path, by "/" and the escaped key, then "=" and the escaped
// configured value for a fixed value or a wildcard pattern (nothing for a
// key-only level):
//
//	rl/source_cluster=proxy/destination_cluster=mock
//	api/user                 (key-only level)
//	files/path=files%2F*     (wildcard level)
//
// Match.Domain (the Charon domain) is the escaped request values of the
// key-only and wildcard levels, in order, joined by ",". A level with
// share_threshold adds nothing, so all values it matches share one limit;
// a path of fixed values only has the empty domain.
//
// Escaping writes %XX (upper-case hex) for the bytes `%/=,:{}~"\`, space,
// controls and every non-ASCII byte, so both strings are printable ASCII
// without Redis hash-tag braces or common separators. Both are bounded to
// MaxKeyLen bytes: a longer one keeps its first MaxKeyLen-17 bytes then "~"
// and the 16 upper-case hex digits of the FNV-1a 64-bit hash of the whole
// escaped string. They depend only on the config path and the request, so
// they are stable across reloads.
//
// A store keys a pair's state by (Resource, Domain, Match.Shape), the shape
// of the policy in force for the pair (tiers.Policy.Shape: its algorithm and
// windows, never its limits), so that counts belong to the rule: a reload
// that changes a limit applies the new limit to the count already made, and
// one that changes a window's shape starts afresh. Limit.ID is a hash of
// the leaf's whole policy set (Policy, Overrides, Copies) with its numbers,
// which names it.
//
// # Metric keys
//
// Match.MetricKey follows envoyproxy/ratelimit's stat key: the RLS domain,
// then per level "." key, with "_" value for a fixed value and "_" pattern
// for a wildcard; a key-only level adds the key alone. The request value is
// used instead (for key-only and wildcard levels) when the level has
// value_to_metric, unless the level has share_threshold; an empty value adds
// nothing. When the matched leaf has detailed_metric, every level adds "_"
// and the request value, even an empty one ("rl.k_v.path_"), unless a level
// of the path has share_threshold: then that level adds its pattern and the
// others the value only when it is not empty. detailed_metric on a level
// that is not the matched leaf does nothing. Keys without request values
// are precomputed.
//
// # Input
//
// A request's descriptors are bounded (MaxEntries, MaxLen) and checked
// here, so that every pipeline matching them names a bad field the same way:
// ValidateResource checks a charon.v1 resource, an *InputError names the
// field of bad input, a *FieldError attributes an operation's error to a
// field, and ErrUnknownResource is a resource matching no limit. The RLS
// pipeline (internal/engine) and the copy operations (internal/holds) both
// answer with them, and the server maps them to gRPC codes in one table.
//
// # Cost
//
// Match does not allocate when the Charon domain is empty or a single value
// needing no escaping, and allocates once otherwise (Domain and a
// request-dependent MetricKey share one string).
package descriptors
