package escrowsim

import (
	"slices"
	"sort"
	"time"

	"github.com/charonlimit/charon/tiers"
)

// Result is what a run measured: a row per window of the rule, and the
// run's summary.
type Result struct {
	Limit  int64   `json:"limit"`
	Window float64 `json:"window_s"`
	// Measured is the window over which grants are held to the limit: the
	// rule's window less the store's bucket width (see the package
	// documentation).
	Measured float64 `json:"measured_window_s"`
	// Margin is the false rejections': a rejection is false when the
	// grants of the window before it are fewer than Limit - Margin.
	Margin  int64   `json:"margin"`
	Rows    []Row   `json:"windows"`
	Summary Summary `json:"summary"`
}

// Row is one window of the run, [End-Window, End).
type Row struct {
	End float64 `json:"end_s"`
	// Requests decided in the window (by the instant they count at),
	// granted, rejected, failed (an error: the home out of reach, with no
	// lease to decide from), and rejected falsely.
	Requests int64 `json:"requests"`
	Granted  int64 `json:"granted"`
	Rejected int64 `json:"rejected"`
	Failed   int64 `json:"failed"`
	False    int64 `json:"false_rejections"`
	// MostGranted is the most grants in any measured window that ends in
	// this one.
	MostGranted int64 `json:"most_granted"`
	// Calls sent to the home, and to the regions' leasers (by the
	// replicas), per request, over the window.
	HomeCalls   float64 `json:"home_calls_per_decision"`
	RegionCalls float64 `json:"region_calls_per_decision"`
	// Local is the part of the decisions made from leases.
	Local float64 `json:"local"`
	// Decision latency percentiles of the requests sent in the window, ms.
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
	// Replicas, by index.
	Replicas []ReplicaRow `json:"replicas"`
}

// ReplicaRow is one replica in one window: its grants, and at the
// window's end its fair share (-1: none) and the hits its leases held.
type ReplicaRow struct {
	Granted int64 `json:"granted"`
	Share   int64 `json:"share"`
	Held    int64 `json:"held"`
	Killed  bool  `json:"killed,omitempty"`
}

// Summary is the whole run.
type Summary struct {
	Requests int64 `json:"requests"`
	Granted  int64 `json:"granted"`
	Rejected int64 `json:"rejected"`
	Failed   int64 `json:"failed"`
	False    int64 `json:"false_rejections"`
	// FalseShare is False over Requests.
	FalseShare float64 `json:"false_rejection_share"`
	// UnderLimit is the rejections while the window before held fewer
	// grants than the limit, by any margin.
	UnderLimit int64 `json:"rejected_under_limit"`
	// MostGranted is the most grants in any measured window; OverGrants
	// the grants that ended a measured window holding more than the
	// limit (0: the limit held).
	MostGranted int64 `json:"most_granted"`
	OverGrants  int64 `json:"over_grants"`
	// GrantedPerWindow is the grants per window of the rule, on average.
	GrantedPerWindow float64 `json:"granted_per_window"`
	HomeCalls        float64 `json:"home_calls_per_decision"`
	RegionCalls      float64 `json:"region_calls_per_decision"`
	Local            float64 `json:"local"`
	P50              float64 `json:"p50_ms"`
	P99              float64 `json:"p99_ms"`
	// The replicas' escrow counters, summed (escrow.Stats).
	Leases    uint64 `json:"leases"`
	GivenBack uint64 `json:"given_back_hits"`
	Expired   uint64 `json:"expired_leases"`
	Refused   uint64 `json:"refused_leases"`
	// With pools, the Regions' counters, summed (escrow.RegionStats):
	// slices taken from the home and the hits they held, slices refused,
	// calls to the home, leases asked for while no slice was open, and
	// slices given back at once (too short).
	Slices        uint64 `json:"slices"`
	SliceHits     uint64 `json:"slice_hits"`
	SlicesRefused uint64 `json:"slices_refused"`
	SliceCalls    uint64 `json:"slice_home_calls"`
	Misses        uint64 `json:"misses"`
	Short         uint64 `json:"short_slices"`
}

// MeasuredWindow returns the window over which the store holds grants to
// limit hits per w: w less its bucket width (package tiers: a window of
// more than 64 hits is counted in buckets of ceil(w/64) µs, and a hit is
// counted while younger than w less a bucket).
func MeasuredWindow(limit int64, w time.Duration) time.Duration {
	if limit <= 64 {
		return w
	}
	b := (w.Microseconds() + 63) / 64
	return w - time.Duration(b)*time.Microsecond
}

// Margin returns the false rejections' margin for limit: a twentieth of
// it (tiers.LeaseRatio), at least one hit. A lease's hits are counted from
// the lease's end, so up to one lease (a twentieth of the window) longer
// than they are used: with the budget full, the grants of the window
// before a rejection may be that much under the limit, by design. The
// rejections under the limit at all are in Summary.UnderLimit.
func Margin(limit int64) int64 { return max(1, limit/tiers.LeaseRatio) }

// measure computes the rows and the summary from the records of a run and
// the samples read at its start, at each window's end, and last once every
// request was answered (what came after o.Duration counts in the last
// window).
func measure(o Options, recs []record, samples []sample) *Result {
	elapsed := int64(o.Duration)
	w := int64(o.Window)
	mw := int64(MeasuredWindow(o.Limit, o.Window))
	res := &Result{Limit: o.Limit, Window: o.Window.Seconds(), Measured: time.Duration(mw).Seconds(), Margin: Margin(o.Limit)}
	nrows := int((elapsed + w - 1) / w)
	rows := make([]Row, nrows)
	lats := make([][]int64, nrows)
	var all []int64
	var grants, rejections []int64
	rowOf := func(t int64) int { return min(max(int(t/w), 0), nrows-1) }
	for i := range rows {
		rows[i].End = time.Duration(int64(i+1) * w).Seconds()
		rows[i].Replicas = make([]ReplicaRow, o.Replicas)
	}
	for _, r := range recs {
		row := &rows[rowOf(r.at)]
		row.Requests++
		switch r.outcome {
		case granted:
			row.Granted++
			row.Replicas[r.replica].Granted++
			grants = append(grants, r.at)
		case rejected:
			row.Rejected++
			rejections = append(rejections, r.at)
		case failed:
			row.Failed++
		}
		k := rowOf(r.sent)
		lats[k] = append(lats[k], r.took)
		all = append(all, r.took)
	}
	slices.Sort(grants)
	s := &res.Summary
	// The most grants in a measured window ending at each grant.
	lo := 0
	for j, t := range grants {
		for grants[lo] <= t-mw {
			lo++
		}
		n := int64(j - lo + 1)
		row := &rows[rowOf(t)]
		row.MostGranted = max(row.MostGranted, n)
		s.MostGranted = max(s.MostGranted, n)
		if n > o.Limit {
			s.OverGrants++
		}
	}
	// A rejection is false when the window of the rule before it held
	// fewer grants than the limit less the margin.
	for _, t := range rejections {
		hi := sort.Search(len(grants), func(i int) bool { return grants[i] > t })
		lo := sort.Search(len(grants), func(i int) bool { return grants[i] > t-w })
		if n := int64(hi - lo); n < o.Limit-res.Margin {
			rows[rowOf(t)].False++
		} else if n < o.Limit {
			s.UnderLimit++
		}
	}
	for i := range rows {
		row := &rows[i]
		row.P50, row.P99 = percentile(lats[i], 0.50), percentile(lats[i], 0.99)
		if i+1 < len(samples) {
			a, b := samples[i], samples[i+1]
			if i == len(rows)-1 {
				b = samples[len(samples)-1]
			}
			if row.Requests > 0 {
				row.HomeCalls = float64(b.home-a.home) / float64(row.Requests)
				row.RegionCalls = float64(b.region-a.region) / float64(row.Requests)
				row.Local = float64(b.localG+b.localR-a.localG-a.localR) / float64(row.Requests)
			}
			for k := range row.Replicas {
				rr := &row.Replicas[k]
				rr.Share, rr.Held, rr.Killed = b.shares[k], b.held[k], b.killed[k]
			}
		} else {
			for k := range row.Replicas {
				row.Replicas[k].Share = -1
			}
		}
		s.Requests += row.Requests
		s.Granted += row.Granted
		s.Rejected += row.Rejected
		s.Failed += row.Failed
		s.False += row.False
	}
	s.UnderLimit += s.False
	if s.Requests > 0 {
		s.FalseShare = float64(s.False) / float64(s.Requests)
		if n := len(samples); n > 0 {
			a, b := samples[0], samples[n-1]
			s.HomeCalls = float64(b.home-a.home) / float64(s.Requests)
			s.RegionCalls = float64(b.region-a.region) / float64(s.Requests)
			s.Local = float64(b.localG+b.localR-a.localG-a.localR) / float64(s.Requests)
		}
	}
	s.GrantedPerWindow = float64(s.Granted) * float64(w) / float64(max(elapsed, 1))
	s.P50, s.P99 = percentile(all, 0.50), percentile(all, 0.99)
	res.Rows = rows
	return res
}

// percentile returns the p-quantile of ns in ms (sorting ns), 0 for none.
func percentile(ns []int64, p float64) float64 {
	if len(ns) == 0 {
		return 0
	}
	slices.Sort(ns)
	i := min(int(p*float64(len(ns))), len(ns)-1)
	return time.Duration(ns[i]).Seconds() * 1000
}
