package dispatch

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/penguinhq/dispatcher/pkg/governor"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// Metrics is what a Dispatcher counts, for Prometheus. No metric has a per-client label:
// client ids are unbounded, and operators find one client with dispatchctl instead.
// A nil *Metrics counts nothing.
type Metrics struct {
	attempts       *prometheus.CounterVec
	attemptTime    prometheus.Histogram
	gap            prometheus.Histogram
	gapRatio       prometheus.Histogram
	belowInterval  prometheus.Counter
	deadLetters    *prometheus.CounterVec
	removals       prometheus.Counter
	foundGoneCount prometheus.Counter
	leftOver       prometheus.Counter
	budgetWaits    prometheus.Histogram
	rateChanges    *prometheus.CounterVec
	cancels        *prometheus.CounterVec
	reg            prometheus.Registerer
}

// NewMetrics registers the dispatcher's metrics with reg. None depends on the interval
// configured at start: the kept gap is measured against the interval in force for each
// client when its attempt starts, so it reads the same after an operator changes it.
func NewMetrics(reg prometheus.Registerer) *Metrics {
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
			Help:    "For each attempt after a client's first: time from the end of the client's previous attempt to the start of this one, by this instance's clock. dispatch_send_gap_ratio relates it to the client's interval.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 20),
		}),
		gapRatio: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dispatch_send_gap_ratio",
			Help:    "For each attempt after a client's first: its gap (dispatch_send_gap_seconds) divided by the client's interval in force. Never below 1; the buckets just above 1 say how close spacing runs.",
			Buckets: []float64{0.5, 0.99, 1, 1.001, 1.002, 1.005, 1.01, 1.05, 1.1, 1.5, 2, 5, 10, 60},
		}),
		belowInterval: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dispatch_send_gaps_below_interval_total",
			Help: "Attempts that started less than the client's interval in force after its previous attempt ended, by this instance's clock. The guarantee: it stays 0; alert on any increase.",
		}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_dead_letters_total",
			Help: "Requests moved to the dead-letter stream, by reason: permanent, attempts_exhausted, age_exhausted, undecodable, purged, expired.",
		}, []string{"reason"}),
		removals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dispatch_removal_failures_total",
			Help: "Requests raven accepted whose removal from the queue failed at the first try (the store did not take writes, NATS was unreachable), or landed only after the partition's lease could have lapsed (the process was paused). Until the removal lands, or when it lands late, the request may be sent again; the log names each.",
		}),
		foundGoneCount: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dispatch_removals_found_gone_total",
			Help: "Requests raven accepted that were gone from the queue when this instance came to remove them: removed before this attempt, so raven may have received them twice. Zero in a healthy deployment; the log names each.",
		}),
		leftOver: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dispatch_unremoved_total",
			Help: "Requests raven accepted that this instance stopped before removing from the queue: each will be sent again, a duplicate raven can drop by its Idempotency-Key.",
		}),
		budgetWaits: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dispatch_raven_budget_wait_seconds",
			Help:    "While raven's budget or adaptive mode is in force: for each attempt handed out, how long its lane had been due (waiting for the budget, a pause, or the loop).",
			Buckets: prometheus.ExponentialBuckets(0.001, 3, 12),
		}),
		cancels: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_cancels_total",
			Help: "Cancels this instance decided, as the owner of the request's client, by outcome: cancelled (left the queue unsent), in_flight (refused: an attempt was under way), not_queued (it had ended already), handover (refused: the client's partition changed hands lately).",
		}, []string{"outcome"}),
		rateChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_raven_rate_changes_total",
			Help: "Changes of the limits this instance holds itself to towards raven, by why: budget (configured or steered), share (partitions moved), refused and slow (adaptive cuts), increase (adaptive), paused and resumed (a 503 with Retry-After).",
		}, []string{"why"}),
	}
	m.reg = reg
	reg.MustRegister(m.attempts, m.attemptTime, m.gap, m.gapRatio, m.belowInterval, m.deadLetters, m.removals, m.foundGoneCount, m.leftOver,
		m.budgetWaits, m.rateChanges, m.cancels)
	for _, o := range []CancelOutcome{Cancelled, CancelInFlight, CancelNotQueued, CancelHandover} {
		m.cancels.WithLabelValues(o.String())
	}
	for _, w := range governor.Whys() {
		m.rateChanges.WithLabelValues(w)
	}
	for _, o := range schedule.Outcomes {
		m.attempts.WithLabelValues(string(o))
	}
	for _, r := range request.Reasons { // every series from zero, as Prometheus asks
		m.deadLetters.WithLabelValues(string(r))
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
		gauge("dispatch_lanes_overdue", "Lanes due for longer than three of their intervals with no attempt started (counted every second): a stall, unless raven's budget holds them back.", func(s Stats) int { return s.Overdue }),
		gauge("dispatch_partitions_lapsed", "Partitions this instance holds whose lease could have lapsed by its own clock: no attempt starts there until a renewal lands, or it lets them go.", func(s Stats) int { return s.Lapsed }),
		gauge("dispatch_in_flight", "Attempts in flight on this instance.", func(s Stats) int { return s.InFlight }),
		gauge("dispatch_partitions_owned", "Partitions this instance owns and sends for.", func(s Stats) int { return s.Owned }),
	)
	budget := func(name, help string, v func(governor.BudgetState) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return v(d.BudgetState()) })
	}
	m.reg.MustRegister(
		budget("dispatch_raven_budget_rate", "Raven's budget in force, attempts per second across all instances (0: no limit).",
			func(s governor.BudgetState) float64 { return s.MaxRate }),
		budget("dispatch_raven_budget_inflight", "Raven's budget in force, attempts in flight across all instances (0: no limit).",
			func(s governor.BudgetState) float64 { return float64(s.MaxInFlight) }),
		budget("dispatch_raven_share_rate", "This instance's share of dispatch_raven_budget_rate: the budget times the part of the partitions it may send for.",
			func(s governor.BudgetState) float64 { return s.ShareRate }),
		budget("dispatch_raven_share_inflight", "This instance's share of dispatch_raven_budget_inflight.",
			func(s governor.BudgetState) float64 { return float64(s.ShareInFlight) }),
		budget("dispatch_raven_effective_rate", "The rate this instance holds itself to now: its share, or less in adaptive mode (0: no limit).",
			func(s governor.BudgetState) float64 { return s.EffectiveRate }),
		budget("dispatch_raven_adaptive_rate", "Adaptive mode: the rate raven's answers allow all instances together, as this instance judges them (0: not limiting).",
			func(s governor.BudgetState) float64 { return s.AdaptiveRate }),
		budget("dispatch_raven_budget_waiting_lanes", "Lanes due but held back by raven's budget or a pause, at the last count (every 250 ms while it binds).",
			func(s governor.BudgetState) float64 { return float64(s.Waiting) }),
		budget("dispatch_raven_paused", "1 while raven's 503 with Retry-After holds every send of this instance back.",
			func(s governor.BudgetState) float64 {
				if time.Now().Before(s.PausedUntil) {
					return 1
				}
				return 0
			}),
	)
}

func (m *Metrics) BudgetWait(d time.Duration) {
	if m != nil {
		m.budgetWaits.Observe(max(d, 0).Seconds())
	}
}

func (m *Metrics) RateChanged(why string) {
	if m != nil {
		m.rateChanges.WithLabelValues(why).Inc()
	}
}

// attempt counts one attempt and its gap; outcome is the decision's, and delivered
// attempts are counted by delivered, once the request is removed.
func (m *Metrics) attempt(start, end, prevEnd time.Time, interval time.Duration, outcome schedule.Outcome) {
	if m == nil {
		return
	}
	m.attemptTime.Observe(end.Sub(start).Seconds())
	if gap := start.Sub(prevEnd); !prevEnd.IsZero() {
		m.gap.Observe(gap.Seconds())
		if interval > 0 {
			m.gapRatio.Observe(float64(gap) / float64(interval))
			if gap < interval {
				m.belowInterval.Inc()
			}
		}
	}
	if outcome != schedule.OutcomeDelivered {
		m.attempts.WithLabelValues(string(outcome)).Inc()
	}
}

func (m *Metrics) delivered() {
	if m != nil {
		m.attempts.WithLabelValues(string(schedule.OutcomeDelivered)).Inc()
	}
}

func (m *Metrics) foundGone() {
	if m != nil {
		m.foundGoneCount.Inc()
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

func (m *Metrics) cancel(outcome string) {
	if m != nil {
		m.cancels.WithLabelValues(outcome).Inc()
	}
}

func (m *Metrics) deadLettered(reason request.Reason) {
	if m != nil {
		m.deadLetters.WithLabelValues(string(reason)).Inc()
	}
}
