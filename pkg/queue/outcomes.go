package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// KeepOutcome stores a request's final event in the request stream, on its client's
// outcome subject (request.OutcomeSubject), until DrainOutcomes has written it to the
// events stream. A dispatcher calls it before removing a request whose final event the
// events stream did not take in time: the removal is a write to the same stream, so what
// keeps this write from landing keeps the removal from landing too, and a crash right
// after the removal cannot lose the final event (ADR 9). An error means it was not kept
// and is worth trying again; a request stream at its size limit is not an error (it is
// logged and counted, and the removal goes ahead: holding it would hold every lane
// while the stream is full).
func (q *Queue) KeepOutcome(ctx context.Context, e request.Event) error {
	if !e.Recordable() {
		return nil // no status to keep: not a request this service stored
	}
	m := nats.NewMsg(request.OutcomeSubject(e.ClientID))
	m.Data = e.Fit(q.eventLimit()).JSON()
	ack, err := q.js.PublishMsg(ctx, m, jetstream.WithMsgID(outcomeMsgID(e)), jetstream.WithExpectStream(RequestStream))
	if err == nil {
		q.writes.note(nil)
		if !ack.Duplicate {
			q.outcomes.kept.Inc()
		}
		return nil
	}
	notKept := func(why string) error {
		q.outcomes.notKept.Inc()
		q.outcomes.log.Error().Err(err).Str("client_id", e.ClientID).Str("request_id", e.ID).Str("type", string(e.Type)).
			Msg("final event not kept: " + why + "; the request is removed all the same, and its status says so only once the events stream takes the event from this process")
		return nil
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeAccountResources {
		return notKept("the account's JetStream limits are reached")
	}
	if err = classifyPublishError(err); errors.Is(err, request.ErrQueueFull) || errors.Is(err, request.ErrBacklogFull) {
		return notKept("the request stream is full")
	}
	q.writes.note(err)
	return fmt.Errorf("keeping the %s event of request %s: %w", e.Type, e.ID, err)
}

// errCodeAccountResources is JSAccountResourcesExceededErr: the account's JetStream
// limits refuse the write.
const errCodeAccountResources = 10002

// outcomeMsgID is a kept event's message id in the request stream: a retried write lands
// once, and no request id (a request's message id there) can be one.
func outcomeMsgID(e request.Event) string { return "outcome:" + eventMsgID(e) }

// DefaultDrainEvery is how often DrainOutcomes looks for kept final events when it found
// none.
const DefaultDrainEvery = 2 * time.Second

// DrainOutcomes writes the final events kept in the request stream (KeepOutcome) to the
// events stream, oldest first, removing each once written, until ctx ends. It looks
// every every (DefaultDrainEvery if zero) while there are none. Every dispatcher runs
// it: two that write the same event write it once (its message id is the event's), and
// removing one already removed is no error.
func (q *Queue) DrainOutcomes(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = DefaultDrainEvery
	}
	log := q.outcomes.log
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := q.drainOutcomes(ctx)
		if n > 0 {
			log.Info().Int("events", n).Msg("final events kept in the request stream written to the events stream")
		}
		if err != nil && ctx.Err() == nil {
			log.Warn().Err(err).Msg("final events kept in the request stream not written yet; trying again")
		}
		t.Reset(every)
	}
}

// drainOutcomes writes and removes kept final events until none is left, or one fails.
func (q *Queue) drainOutcomes(ctx context.Context) (int, error) {
	n := 0
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, EventReadTimeout)
		m, err := q.reqs.GetMsg(rctx, 0, jetstream.WithGetMsgSubject(request.OutcomePrefix+">"))
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("reading kept final events: %w", err)
		}
		var e request.Event
		if json.Unmarshal(m.Data, &e) == nil && e.Recordable() {
			write, err := q.stillNeeded(ctx, e)
			if err != nil {
				return n, err
			}
			if write {
				if err := q.WriteEvent(ctx, e); err != nil {
					return n, err
				}
				n++
			}
		}
		// One this service did not write is removed unwritten: it would stop the others.
		if err := q.reqs.DeleteMsg(ctx, m.Sequence); err != nil && !isNotFound(err) {
			return n, fmt.Errorf("removing kept final event %d: %w", m.Sequence, err)
		}
		q.outcomes.drained.Inc()
	}
	return n, ctx.Err()
}

// outcomeMetrics count what KeepOutcome and DrainOutcomes did, and hold their log.
type outcomeMetrics struct {
	log                    zerolog.Logger
	kept, notKept, drained prometheus.Counter
}

func newOutcomeMetrics() outcomeMetrics {
	return outcomeMetrics{
		log:     zerolog.Nop(),
		kept:    prometheus.NewCounter(prometheus.CounterOpts{Name: "dispatch_outcomes_kept_total", Help: "Final events the events stream did not take in time, kept in the request stream before their request was removed (ADR 9)."}),
		notKept: prometheus.NewCounter(prometheus.CounterOpts{Name: "dispatch_outcomes_not_kept_total", Help: "Final events that could not be kept in the request stream because it was full: a crash before the events stream takes them loses them."}),
		drained: prometheus.NewCounter(prometheus.CounterOpts{Name: "dispatch_outcomes_drained_total", Help: "Kept final events written to the events stream and removed from the request stream."}),
	}
}

// ObserveOutcomes registers the counters of kept final events with reg (if not nil) and
// logs about them to log.
func (q *Queue) ObserveOutcomes(reg prometheus.Registerer, log zerolog.Logger) {
	q.outcomes.log = log.With().Str("component", "outcomes").Logger()
	if reg != nil {
		reg.MustRegister(q.outcomes.kept, q.outcomes.notKept, q.outcomes.drained)
	}
}

// stillNeeded says whether kept event e is still to be written: not when the events
// stream holds it already (the writer's copy landed; written again after the duplicate
// window it would reach penguin's feed twice), nor when the request has moved on to a
// later replay cycle (written now, it would hide that cycle's own final event).
func (q *Queue) stillNeeded(ctx context.Context, e request.Event) (bool, error) {
	events, err := q.Events(ctx, e.ClientID, e.ID)
	if err != nil {
		return false, err
	}
	for _, have := range events {
		if have.Cycle > e.Cycle || have.Cycle == e.Cycle && have.Type == e.Type && have.Seq == e.Seq {
			return false, nil
		}
	}
	return true, nil
}
