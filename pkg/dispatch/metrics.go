package dispatch

import (
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics is what a Dispatcher counts, for Prometheus. No metric has a per-client label:
// client ids are unbounded, and operators find one client with dispatchctl instead.
// A nil *Metrics counts nothing.
type Metrics struct {
	attempts    *prometheus.CounterVec
	attemptTime prometheus.Histogram
	gap         prometheus.Histogram
	deadLetters *prometheus.CounterVec
	removals    prometheus.Counter
	leftOver    prometheus.Counter
	reg         prometheus.Registerer
}

// Outcomes of an attempt, as the "outcome" label of dispatch_attempts_total.
const (
	OutcomeDelivered = "delivered"
	OutcomeTransient = "transient_failure"
	OutcomePermanent = "permanent_failure"
)

// NewMetrics registers the dispatcher's metrics with reg. interval shapes the buckets of
// the gap histogram, so that the buckets just around it say how close spacing runs.
func NewMetrics(reg prometheus.Registerer, interval time.Duration) *Metrics {
	iv := interval.Seconds()
	var gapBuckets []float64
	for _, f := range []float64{0.5, 0.99, 1, 1.001, 1.002, 1.005, 1.01, 1.05, 1.1, 1.5, 2, 5, 10, 60} {
		gapBuckets = append(gapBuckets, math.Round(iv*f*1e6)/1e6) // to the microsecond: readable labels
	}
	m := &Metrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_attempts_total",
			Help: "Attempts to send a request to raven, by outcome: delivered, transient_failure (retried or dead-lettered once out of attempts or age), permanent_failure (dead-lettered).",
		}, []string{"outcome"}),
		attemptTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dispatch_attempt_duration_seconds",
			Help:    "How long one attempt to raven took, from the start of the POST to its answer or failure.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
		}),
		gap: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dispatch_send_gap_seconds",
			Help:    "For each attempt after a client's first: time from the end of the client's previous attempt to the start of this one. Never below the interval in force for the client.",
			Buckets: gapBuckets,
		}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_dead_letters_total",
			Help: "Requests moved to the dead-letter stream, by reason: permanent, attempts-exhausted, age-exhausted, undecodable, purged.",
		}, []string{"reason"}),
		removals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dispatch_removal_failures_total",
			Help: "Requests raven accepted whose removal from the queue failed at the first try (the store did not take writes, NATS was unreachable), or landed only after the partition's lease could have lapsed (the process was paused). Until the removal lands, or when it lands late, the request may be sent again; the log names each.",
		}),
		leftOver: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dispatch_unremoved_total",
			Help: "Requests raven accepted that this instance stopped before removing from the queue: each will be sent again, a duplicate raven can drop by its Idempotency-Key.",
		}),
	}
	m.reg = reg
	reg.MustRegister(m.attempts, m.attemptTime, m.gap, m.deadLetters, m.removals, m.leftOver)
	for _, o := range []string{OutcomeDelivered, OutcomeTransient, OutcomePermanent} {
		m.attempts.WithLabelValues(o)
	}
	return m
}

// watch registers the gauges read from d's Stats at each scrape, so that the send loop
// does no metrics work for them.
func (m *Metrics) watch(d *Dispatcher) {
	if m == nil {
		return
	}
	gauge := func(name, help string, v func(Stats) int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return float64(v(d.Stats())) })
	}
	m.reg.MustRegister(
		gauge("dispatch_active_lanes", "Clients this instance holds a lane for: with a backlog, or sent to within the interval.", func(s Stats) int { return s.Lanes }),
		gauge("dispatch_in_flight", "Attempts in flight on this instance.", func(s Stats) int { return s.InFlight }),
		gauge("dispatch_partitions_owned", "Partitions this instance owns and sends for.", func(s Stats) int { return s.Owned }),
	)
}

// attempt counts one attempt and its gap; outcome is judge's, and delivered attempts
// are counted by delivered, once the request is removed.
func (m *Metrics) attempt(start, end, prevEnd time.Time, outcome string) {
	if m == nil {
		return
	}
	m.attemptTime.Observe(end.Sub(start).Seconds())
	if !prevEnd.IsZero() {
		m.gap.Observe(start.Sub(prevEnd).Seconds())
	}
	if outcome != OutcomeDelivered {
		m.attempts.WithLabelValues(outcome).Inc()
	}
}

func (m *Metrics) delivered() {
	if m != nil {
		m.attempts.WithLabelValues(OutcomeDelivered).Inc()
	}
}

func (m *Metrics) removalFailed() {
	if m != nil {
		m.removals.Inc()
	}
}

func (m *Metrics) unremoved() {
	if m != nil {
		m.leftOver.Inc()
	}
}

func (m *Metrics) deadLettered(reason string) {
	if m != nil {
		m.deadLetters.WithLabelValues(reason).Inc()
	}
}
