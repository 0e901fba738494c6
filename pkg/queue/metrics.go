package queue

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// collector reports the queue's state, read from JetStream at each scrape. The figures
// are the whole queue's, the same from every instance that reports them.
type collector struct {
	q                                              *Queue
	up, requests, clients, oldest, bytes, deadLtrs *prometheus.Desc
}

// NewCollector returns a Prometheus collector of the queue's state: backlog size, clients
// with a backlog, the oldest request's age, and the dead-letter stream's size.
func NewCollector(q *Queue) prometheus.Collector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &collector{
		q:        q,
		up:       d("dispatch_queue_up", "1 when the queue's state could be read at this scrape, else 0 (and the other dispatch_queue_* figures are missing)."),
		requests: d("dispatch_queue_requests", "Requests queued, across all clients."),
		clients:  d("dispatch_queue_clients", "Clients with at least one request queued."),
		oldest:   d("dispatch_queue_oldest_age_seconds", "Age of the oldest queued request, 0 when none is queued."),
		bytes:    d("dispatch_queue_bytes", "Bytes the request stream holds."),
		deadLtrs: d("dispatch_dead_letter_requests", "Requests in the dead-letter stream."),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.requests, c.clients, c.oldest, c.bytes, c.deadLtrs} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := c.q.Stats(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	age := 0.0
	if !st.Oldest.IsZero() {
		age = max(time.Since(st.Oldest).Seconds(), 0)
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(c.requests, prometheus.GaugeValue, float64(st.Requests))
	ch <- prometheus.MustNewConstMetric(c.clients, prometheus.GaugeValue, float64(st.Clients))
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, age)
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(st.RequestBytes))
	ch <- prometheus.MustNewConstMetric(c.deadLtrs, prometheus.GaugeValue, float64(st.DeadLetters))
}
