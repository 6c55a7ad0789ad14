// Package decisionlog writes a bounded, sampled stream of rate-limit
// decisions as JSON lines (one Record per line), for monitoring and for
// tuning limits from real traffic (`charon suggest` reads it back).
//
// A decision is logged without slowing it: Keep decides in a few atomic
// operations whether a line is kept (every rejection, shadow rejection and
// burst into a higher tier is; other decisions are sampled), and Log hands
// the line to a writer goroutine through a bounded queue. Lines beyond the
// rate bound or a full queue are dropped and counted, never waited for.
//
// A complete log (Options.All, charon serve --decision-log-all) keeps a line
// for every descriptor of every request, those no limit applied to too,
// each naming its request, so that `charon replay` can feed the same
// requests through another configuration; a sampled log cannot say what a
// tighter limit would have rejected, as most grants are missing from it.
package decisionlog
