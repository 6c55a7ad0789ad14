package rls

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/charonlimit/charon/internal/engine"
)

// pacer is an Engine that paces (pace: on a descriptor) and counts it.
type pacer interface {
	Pace() *engine.PaceStats
}

// registerPace adds the pacing collectors of p to m's registry:
// charon_pace_waiting (requests held now), charon_pace_granted_total
// (granted after a wait), charon_pace_full_total (refused a wait because
// --pace-max-waiting requests were held), charon_pace_cancelled_total
// (waits their caller gave up, their reservations given back),
// charon_pace_unreserved_total (the store did not reserve) and
// charon_pace_give_back_failed_total (the store failed a give-back).
func (m *metrics) registerPace(p *engine.PaceStats) error {
	cs := []prometheus.Collector{prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "charon", Subsystem: "pace", Name: "waiting",
		Help: "ShouldRateLimit requests held by pacing now, waiting for their reserved grant.",
	}, func() float64 { return float64(p.Waiting()) })}
	for _, c := range []struct {
		name, help string
		value      func() uint64
	}{
		{"granted_total", "ShouldRateLimit requests granted after a wait (pace: on a descriptor) instead of rejected.", p.Granted},
		{"full_total", "Requests answered OVER_LIMIT though their wait was within their pace, because --pace-max-waiting requests were held.", p.Full},
		{"cancelled_total", "Paced waits given up by their caller (deadline, cancel); their reservations were given back.", p.Cancelled},
		{"unreserved_total", "Requests answered OVER_LIMIT though their wait was within their pace, because the store could not reserve their grant (it failed, or the keys span Redis Cluster slots).", p.Unreserved},
		{"give_back_failed_total", "Give-backs of cancelled waits the store failed: their hits stay counted until their windows pass.", p.GiveBackFailed},
	} {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "charon", Subsystem: "pace", Name: c.name, Help: c.help},
			func() float64 { return float64(c.value()) }))
	}
	for _, c := range cs {
		if err := m.reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
