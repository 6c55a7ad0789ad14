// Package redisfunc loads the Redis 7 function libraries Charon's Redis
// stores decide with (the rate-limit store's decide library, the copy store's
// copies.lua) and runs their calls, once for both stores:
//
//   - a Library is named after a hash of its code (New), so processes of
//     different versions sharing one Redis each call their own code;
//   - Load loads it with FUNCTION LOAD REPLACE on every master (every
//     master of a Cluster, the one node otherwise);
//   - Run runs a call and, when Redis answers that it lacks the function
//     (a restart without persistence, a failover to a node that never had
//     it, a FUNCTION FLUSH), loads the library and runs the call once more:
//     the function did not run, so the second call is not a repetition;
//   - Ready pings every master and loads the library where it is missing,
//     for a health probe that leaves Redis ready to decide.
//
// A caller that sends its calls another way (a pipeline) reloads with
// IsNotFound and Load itself.
//
// Clock names the clock a function decides on: the Redis master's (TIME,
// read inside the function) or the caller's.
package redisfunc
