package queue

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// AnswerTime is how long a dispatcher takes at most over a question whose asker waits
// within (its Dispatch-Answer-Within header).
func AnswerTime(within string) time.Duration { return answerTime(within) }

// RequeuePublishOnly is Requeue stopped between its two steps, as by a crash.
func (q *Queue) RequeuePublishOnly(r request.DeadLetter) (bool, error) {
	dup, _, err := q.requeuePublish(context.Background(), r)
	return dup, err
}

// ProbeWrite is one test write, as WatchWrites makes them.
func (q *Queue) ProbeWrite() error { return q.probeWrite(context.Background()) }

// PendingPublishes is how many publishes made without waiting still wait for their
// acknowledgement, each holding a slot of the connection's pool.
func (q *Queue) PendingPublishes() int { return q.js.PublishAsyncPending() }

// LastError is the last error the connection met (a refusal of its credentials, a
// failed TLS handshake), nil if none.
func (c *Conn) LastError() error { return c.nc.LastError() }

// OutcomeCount is one of the kept-outcome counters: "kept", "not_kept" or "drained".
func (q *Queue) OutcomeCount(name string) float64 {
	return valueOf(map[string]prometheus.Counter{"kept": q.outcomes.kept, "not_kept": q.outcomes.notKept, "drained": q.outcomes.drained}[name])
}

// LinkProven is what the dispatch_queue_link_proven gauge reads now.
func (q *Queue) LinkProven() float64 { return valueOf(q.LinkCollector()) }

// valueOf is what a collector of one counter or gauge reads now; -1 if it gives none.
func valueOf(c prometheus.Collector) float64 {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 {
		return -1
	}
	m := mfs[0].GetMetric()[0]
	if m.GetCounter() != nil {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

// PreferBatches makes PublishAll take the atomic way (atomic) or the one-by-one way for
// every batch it can, as if it had measured that way far cheaper, for the next hour.
func (q *Queue) PreferBatches(atomic bool) {
	q.batchMu.Lock()
	defer q.batchMu.Unlock()
	q.batchCosts = writeCosts{atomic: 1e-9, each: 1, tried: time.Now().Add(time.Hour)}
	if !atomic {
		q.batchCosts.atomic, q.batchCosts.each = 1, 1e-9
	}
}

// RequestConsumers is how many consumers the request stream has.
func (q *Queue) RequestConsumers(ctx context.Context) (int, error) {
	info, err := q.reqs.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Consumers, nil
}

// DeleteRequestConsumers deletes every consumer of the request stream, as a server that
// lost them would.
func (q *Queue) DeleteRequestConsumers(ctx context.Context) error {
	for name := range q.reqs.ListConsumers(ctx).Info() {
		if err := q.reqs.DeleteConsumer(ctx, name.Name); err != nil {
			return err
		}
	}
	return nil
}

// LookupNear is a queued lookup's direct reads alone, without the scan it falls back to.
func (q *Queue) LookupNear(ctx context.Context, id, clientID string, at time.Time) (bool, error) {
	_, ok, err := q.lookupNear(ctx, id, clientID, at)
	return ok, err
}
