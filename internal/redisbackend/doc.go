// Package redisbackend runs Charon's shared state in Redis: it opens one
// go-redis client for a URL and builds on it the rate-limit store (the
// Redis store behind package resilient's deadline, breaker, failure mode
// and over-limit cache) and the copy store, then runs what keeps them
// healthy: the probe that closes the breaker once Redis answers pings again
// (and tells the server whether to report SERVING), and the reaper that
// releases lapsed holds of copy logs nobody touches. Each store's
// Prometheus collector is registered by Register.
//
// `charon serve --store redis` maps its flags to Options and calls Open,
// Register and Run; nothing else of the process knows Redis.
package redisbackend
