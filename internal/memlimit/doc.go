// Package memlimit reads the memory limit of the container a process runs in
// and derives from it what the process may spend: the Go runtime's soft
// memory limit and the garbage collector's heap floor (package gctune).
//
// A rate limit server under a flood of new values allocates fast and keeps
// little: its live heap is a few MiB whatever it is sent, so what it holds
// from the operating system is set by when its collector runs, not by what
// it tracks. Left to a fixed heap floor, a process in a small container is
// killed for memory it did not need. The limit is read once, at start: from
// cgroup v2's memory.max or cgroup v1's memory.limit_in_bytes, of the
// process's own cgroup and every ancestor, the least of them. An explicit
// GOMEMLIMIT, or a flag the operator sets, wins over what is derived.
package memlimit
