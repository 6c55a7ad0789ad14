// Package decisionlog writes a bounded, sampled stream of rate-limit
// decisions as JSON lines (one Record per line), for monitoring and for
// tuning limits from real traffic (`charon suggest` reads it back).
//
// A decision is logged without slowing it: Keep decides in a few atomic
// operations whether a line is kept (every rejection, shadow rejection and
// burst into a higher tier is; other decisions are sampled), and Log hands
// the line to a writer goroutine through a bounded queue. Lines beyond the
// rate bound or a full queue are dropped and counted, never waited for.
package decisionlog
