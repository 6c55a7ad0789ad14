// Package statefile keeps the in-memory store's rate-limit states across a
// restart: a versioned file of records, each a state's compact form
// (tiers.State.AppendCompact, the form the Redis function keeps) under its
// key and its forgetting time, protected by a CRC-32C checksum, written to a
// temporary file and renamed over the old one so that a crash mid-write
// leaves the previous snapshot whole. A Keeper restores the file at start,
// refusing one that is corrupt, truncated, foreign or of a later version,
// starting empty (once, with a warning) from one of an earlier version,
// whose keys this one does not read, and writes it every interval, on
// demand and at Close. A record's key holds its policy's shape, not its
// limits: a limit changed across a restart applies to the counts restored.
//
// Why a file of our own and not an embedded database (bbolt, Badger,
// Pebble): the store is a cache of counts that is written whole at once and
// read whole once, at start. Nothing is read by key from disk, nothing needs
// transactions across writes, and a snapshot of a million pairs is tens of
// megabytes written sequentially. A database would add a dependency, a
// write-ahead log or compaction to tune, and a second home for states that
// the memory store must still hold; an atomically renamed file with a
// checksum gives the one guarantee needed: a whole snapshot or none.
package statefile
