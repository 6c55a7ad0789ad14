// Package periodic calls a function at a fixed interval, on a goroutine of
// its own, until stopped: the background sweepers of the in-memory stores.
package periodic
