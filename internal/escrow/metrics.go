package escrow

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/charonlimit/charon/internal/collect"
)

// counters are the Store's counts, read by Stats.
type counters struct {
	localGranted, localRejected, remote        atomic.Uint64
	leases, leasedHits, givenBack, leaseExcess atomic.Uint64
	expired, leaseRefusals, leaseErrors        atomic.Uint64
	giveBackErrors, leaseCalls                 atomic.Uint64
	entered, left, full, overShare, late       atomic.Uint64
	rebalances, rebalanceErrors                atomic.Uint64
}

// Stats are a Store's counters since New, and the pairs in escrow now.
type Stats struct {
	// Decisions by where they were made: LocalGranted and LocalRejected
	// from leases (items), Remote on the shared store.
	LocalGranted, LocalRejected, Remote uint64
	// Leases taken and the hits they held; GivenBack the hits given back
	// (unused at their end, and the excess a check found); Excess the
	// hits a check found over a limit; Expired the leases that ran their
	// length; Refused the leases the store refused (the pair full);
	// Errors the lease calls that failed; GiveBackErrors the give-backs
	// that failed (those hits stay counted until their window forgets
	// them); Calls every call to the leaser (reservations, checks,
	// give-backs).
	Leases, LeasedHits, GivenBack, Excess    uint64
	Expired, Refused, Errors, GiveBackErrors uint64
	Calls                                    uint64
	// Pairs entering and leaving escrow, those not entered for MaxKeys,
	// and leases not asked for because the replica held its fair share.
	Entered, Left, Full, OverShare uint64
	// Late are leases that arrived ended (their calls took longer than
	// their length), given back at once; the next lease of the pair lasts
	// three times as long as the calls took.
	Late uint64
	// Rebalances of fair shares, and those that failed.
	Rebalances, RebalanceErrors uint64
	// Keys is the pairs in escrow now.
	Keys int64
}

// Stats returns the counters. Safe for concurrent use.
func (s *Store) Stats() Stats {
	c := &s.stats
	return Stats{
		LocalGranted: c.localGranted.Load(), LocalRejected: c.localRejected.Load(), Remote: c.remote.Load(),
		Leases: c.leases.Load(), LeasedHits: c.leasedHits.Load(), GivenBack: c.givenBack.Load(), Excess: c.leaseExcess.Load(),
		Expired: c.expired.Load(), Refused: c.leaseRefusals.Load(), Errors: c.leaseErrors.Load(),
		GiveBackErrors: c.giveBackErrors.Load(), Calls: c.leaseCalls.Load(),
		Entered: c.entered.Load(), Left: c.left.Load(), Full: c.full.Load(), OverShare: c.overShare.Load(), Late: c.late.Load(),
		Rebalances: c.rebalances.Load(), RebalanceErrors: c.rebalanceErrors.Load(),
		Keys: s.nkeys.Load(),
	}
}

// NewCollector exports a Store's Stats, read at every scrape:
//
//	charon_escrow_decisions_total{path}  items decided: local_granted, local_rejected, remote
//	charon_escrow_keys                   pairs in escrow now
//	charon_escrow_leases_total           leases taken
//	charon_escrow_leased_hits_total      hits the leases held
//	charon_escrow_given_back_hits_total  hits given back (unused, or over a limit at the check)
//	charon_escrow_expired_total          leases that ran their length
//	charon_escrow_refused_total          leases the shared store refused (the pair full)
//	charon_escrow_errors_total           lease calls that failed
//	charon_escrow_give_back_errors_total give-backs that failed
//	charon_escrow_calls_total            calls to the shared store for leases
//	charon_escrow_entered_total, charon_escrow_left_total  pairs entering, leaving escrow
//	charon_escrow_late_total             leases that arrived ended, given back
//	charon_escrow_rebalances_total       fair shares computed
//	charon_escrow_rebalance_errors_total
func NewCollector(stats func() Stats) prometheus.Collector {
	counter := func(name, help string, v func(Stats) uint64) collect.Metric[Stats] {
		return collect.Metric[Stats]{Name: name, Help: help, Counter: true, Value: func(s Stats) float64 { return float64(v(s)) }}
	}
	return &escrowCollector{stats: stats, Collector: collect.Collector("charon", "escrow", stats,
		collect.Metric[Stats]{Name: "keys", Help: "Pairs decided from escrow leases on this replica now.",
			Value: func(s Stats) float64 { return float64(s.Keys) }},
		counter("leases_total", "Escrow leases taken.", func(s Stats) uint64 { return s.Leases }),
		counter("leased_hits_total", "Hits the escrow leases held when taken.", func(s Stats) uint64 { return s.LeasedHits }),
		counter("given_back_hits_total", "Hits of escrow leases given back: unused when the lease ended, or over a limit at its check.", func(s Stats) uint64 { return s.GivenBack }),
		counter("expired_total", "Escrow leases that ran their length.", func(s Stats) uint64 { return s.Expired }),
		counter("refused_total", "Escrow leases the shared store refused: the pair was full.", func(s Stats) uint64 { return s.Refused }),
		counter("errors_total", "Escrow lease calls that failed (a lease whose answer was lost stays counted until its window forgets it).", func(s Stats) uint64 { return s.Errors }),
		counter("give_back_errors_total", "Give-backs of escrow leases that failed: those hits stay counted until their window forgets them.", func(s Stats) uint64 { return s.GiveBackErrors }),
		counter("calls_total", "Calls to the shared store for escrow leases: reservations, checks, give-backs.", func(s Stats) uint64 { return s.Calls }),
		counter("entered_total", "Pairs that entered escrow (hot).", func(s Stats) uint64 { return s.Entered }),
		counter("late_total", "Escrow leases that arrived ended (their calls took longer than their length), given back at once.", func(s Stats) uint64 { return s.Late }),
		counter("left_total", "Pairs that left escrow (cold, or no longer leasable).", func(s Stats) uint64 { return s.Left }),
		counter("rebalances_total", "Fair shares of pairs in escrow computed on the share store.", func(s Stats) uint64 { return s.Rebalances }),
		counter("rebalance_errors_total", "Fair share computations that failed (the last share is kept).", func(s Stats) uint64 { return s.RebalanceErrors }),
	)}
}

var decisionsDesc = prometheus.NewDesc("charon_escrow_decisions_total",
	"Items of requests on escrow-enabled rules by where they were decided: local_granted and local_rejected from leases, remote on the shared store.",
	[]string{"path"}, nil)

// escrowCollector adds the decisions by path, a counter with a label.
type escrowCollector struct {
	prometheus.Collector
	stats func() Stats
}

func (c *escrowCollector) Describe(ch chan<- *prometheus.Desc) {
	c.Collector.Describe(ch)
	ch <- decisionsDesc
}

func (c *escrowCollector) Collect(ch chan<- prometheus.Metric) {
	c.Collector.Collect(ch)
	s := c.stats()
	for _, p := range []struct {
		path string
		v    uint64
	}{{"local_granted", s.LocalGranted}, {"local_rejected", s.LocalRejected}, {"remote", s.Remote}} {
		ch <- prometheus.MustNewConstMetric(decisionsDesc, prometheus.CounterValue, float64(p.v), p.path)
	}
}
