package ingest

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics is what the ingest API counts, for Prometheus. A nil *Metrics counts nothing.
type Metrics struct {
	requests *prometheus.CounterVec
	outcomes map[string]prometheus.Counter // each outcome's series, found without hashing labels
	publish  prometheus.Histogram
}

// Outcomes are the outcome label's values: accepted, duplicate, and the problem code of
// every refusal that is counted.
var Outcomes = []string{"accepted", "duplicate", "unauthorized", "overloaded", "backlog_full", "queue_full",
	"queue_unavailable", "unsupported_media_type", "body_timeout", "body_unreadable", "body_too_large",
	"malformed_json", "client_id_invalid", "client_id_missing", "client_id_mismatch", "idempotency_key_invalid", "not_before_invalid", "not_after_invalid", "prefer_wait_invalid",
	"body_missing", "item_invalid", "batch_too_large", "batch_empty",
	"client_not_allowed", "idempotency_key_reused", "tenant_delayed_full", "tenant_backlogs_full", "tenant_reads_full", "tenant_publishing_full"}

// NewMetrics registers the ingest metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_ingest_requests_total",
			Help: "Requests posted to ingest, by outcome: accepted, duplicate (an Idempotency-Key seen before; nothing new queued), or the problem code of a refusal.",
		}, []string{"outcome"}),
		publish: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dispatch_ingest_publish_duration_seconds",
			Help:    "How long JetStream took to acknowledge a request, successful or not.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 14),
		}),
	}
	reg.MustRegister(m.requests, m.publish)
	m.outcomes = make(map[string]prometheus.Counter, len(Outcomes))
	for _, o := range Outcomes { // every series from zero, as Prometheus asks
		m.outcomes[o] = m.requests.WithLabelValues(o)
	}
	return m
}

func (m *Metrics) outcome(o string) {
	if m == nil {
		return
	}
	if c, ok := m.outcomes[o]; ok {
		c.Inc()
		return
	}
	m.requests.WithLabelValues(o).Inc()
}

func (m *Metrics) published(took time.Duration) {
	if m != nil {
		m.publish.Observe(took.Seconds())
	}
}
