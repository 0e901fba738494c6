package dispatch

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
	"github.com/penguinhq/dispatcher/pkg/tracing"
)

// Settling an attempt: the outcome's event written (or kept beside the request) before
// the request's removal or dead-lettering, inside the partition's lease (ADR 9).

// bury dead-letters st unsent, for why, and says so in the result.
func (d *Dispatcher) bury(ctx context.Context, job schedule.Job, st request.Stored, why request.Verdict, sendBy time.Time) schedule.Result {
	if d.finish(ctx, st, why, sendBy) != nil {
		return schedule.Result{Lane: job.Lane, Kind: schedule.Failed}
	}
	d.deadLettered(why.Reason)
	return schedule.Result{Lane: job.Lane, Kind: schedule.DeadLettered}
}

// remove deletes a delivered request from the queue, retrying until it lands or ctx ends
// (shutdown), after keeping its final event in the queue if the events did not take it
// (unwritten, nil when they did). A failure, or a removal that lands after the lease
// could have lapsed (sendBy, zero without leases), is logged with the request's id and
// counted: these are what make a duplicate possible.
func (d *Dispatcher) remove(ctx context.Context, st request.Stored, sendBy time.Time, unwritten *request.Event) error {
	del := d.keepThenDelete(st, unwritten)
	err := del(ctx)
	gone := errors.Is(err, request.ErrNotQueued)
	late := !sendBy.IsZero() && d.now().After(sendBy.Add(d.cfg.leaseMargin()))
	switch {
	case gone && !late:
		// Within the lease nothing but this instance removes the request (an operator's
		// cancel waits for the attempt): it was removed before this attempt was made, and
		// raven may have had it twice (G5). Said, for the operator, never passed over.
		d.cfg.Metrics.foundGone()
		d.log.Error().Str("client_id", st.ClientID).Str("request_id", st.ID).Func(tracing.Log(st.TraceParent)).Uint64("seq", st.Seq).Msg(LogRemovedBefore)
		return nil
	case err == nil || gone: // gone when late: the next owner's removal
		if late {
			d.cfg.Metrics.removalFailed()
			d.log.Warn().Str("client_id", st.ClientID).Str("request_id", st.ID).Func(tracing.Log(st.TraceParent)).Msg(LogRemovalLate)
		}
		return nil
	}
	d.cfg.Metrics.removalFailed()
	d.log.Warn().Err(err).Str("client_id", st.ClientID).Str("request_id", st.ID).Func(tracing.Log(st.TraceParent)).Msg(LogRemovalFailed)
	if err := d.retry(ctx, true, func() error { return notQueuedIsDone(del(ctx)) }); err != nil {
		d.cfg.Metrics.unremoved()
		d.log.Warn().Str("client_id", st.ClientID).Str("request_id", st.ID).Func(tracing.Log(st.TraceParent)).Msg("delivered request left in the queue at shutdown: it will be sent again")
		return err
	}
	d.log.Info().Str("client_id", st.ClientID).Str("request_id", st.ID).Func(tracing.Log(st.TraceParent)).Msg("delivered request removed from the queue after retrying")
	return nil
}

// finish moves st to the dead-letter stream, then removes it from the queue, retrying
// both until they succeed or ctx ends. Its event is written in between: once the dead
// letter exists, and before the request leaves the queue (kept in the queue first if the
// events did not take it).
func (d *Dispatcher) finish(ctx context.Context, st request.Stored, why request.Verdict, sendBy time.Time) error {
	var del func(context.Context) error
	return d.retry(ctx, false, func() error {
		if del == nil {
			if err := d.src.AddDeadLetter(ctx, st, why); err != nil {
				return err
			}
			var unwritten *request.Event
			if d.cfg.Events != nil {
				ev := eventOf(st, request.EventDeadLettered)
				if why.Reason == request.ReasonPurged {
					ev.Type = request.EventPurged
				}
				ev.Reason, ev.Attempt, ev.Status, ev.Error = why.Reason, why.Attempts, why.LastStatus, why.LastError
				ev.Response = why.Answer
				unwritten = d.writeNow(ctx, ev, sendBy)
			}
			del = d.keepThenDelete(st, unwritten)
		}
		return notQueuedIsDone(del(ctx))
	})
}

// notQueuedIsDone takes a removal that found its request gone for one that landed: on a
// retry, the earlier try may have landed and its answer been lost.
func notQueuedIsDone(err error) error {
	if errors.Is(err, request.ErrNotQueued) {
		return nil
	}
	return err
}

// keepThenDelete is st's removal, to be retried until it lands: the final event the
// events did not take (unwritten, if not nil) is kept in the queue first, once, so that
// no removal lands while the final event is held only in this process's memory (G10
// across a crash, ADR 9). Both are writes to the queue's store: what holds up one holds
// up the other, and the removal waits for nothing it did not wait for already.
func (d *Dispatcher) keepThenDelete(st request.Stored, unwritten *request.Event) func(context.Context) error {
	return func(ctx context.Context) error {
		if unwritten != nil {
			if err := d.src.KeepOutcome(ctx, *unwritten); err != nil {
				return err
			}
			unwritten = nil
		}
		return d.src.Delete(ctx, st.Lane, st.Seq)
	}
}

// StartedEventAfter is how long an attempt runs before its attempt_started event is
// written: most attempts end sooner, and their outcome's event says all there is to
// say, so a status reads queued, not in_flight, for at most this long of an attempt.
// Writing one for every attempt would add a third write per request to the store.
const StartedEventAfter = 250 * time.Millisecond

// recordStarted records st's attempt_started event should the attempt run longer than
// StartedEventAfter. Call the function it returns when the attempt has ended: from then
// on the event is not recorded, and one recorded is before any event the caller records
// next.
func (d *Dispatcher) recordStarted(st request.Stored, attempt int, start time.Time) (ended func()) {
	if d.cfg.Events == nil {
		return func() {}
	}
	var mu sync.Mutex
	over := false
	t := time.AfterFunc(StartedEventAfter, func() {
		mu.Lock()
		defer mu.Unlock()
		if !over {
			ev := eventOf(st, request.EventAttemptStarted)
			ev.Attempt, ev.At = attempt, start
			d.cfg.Events.Record(ev)
		}
	})
	return func() {
		t.Stop()
		mu.Lock()
		over = true
		mu.Unlock()
	}
}

// eventWait bounds the wait for a final event's write before the request is removed
// all the same (the event writer then keeps retrying it).
const eventWait = 2 * time.Second

// writeNow writes a final event before its request is removed, waiting up to eventWait,
// and with leases (sendBy not zero) no later than the attempt's own deadline, sendBy plus
// the send timeout: the lease then still has a tenth of its TTL to run, the room the
// removal is given. A longer wait could land the removal after the lease lapsed, when the
// partition's next owner may already have sent the request again.
//
// It returns the event if it was not written (nil if it was), as the event writer holds
// it: the same event, kept in the queue, is written once however many copies land.
func (d *Dispatcher) writeNow(ctx context.Context, ev request.Event, sendBy time.Time) (unwritten *request.Event) {
	deadline := d.now().Add(eventWait)
	if by := sendBy.Add(d.cfg.SendTimeout); !sendBy.IsZero() && by.Before(deadline) {
		deadline = by
	}
	ctx, cancel := context.WithTimeout(ctx, deadline.Sub(d.now()))
	defer cancel()
	if ev.At.IsZero() {
		ev.At = d.now()
	}
	ev.Instance = d.cfg.InstanceID
	if d.cfg.Events.WriteNow(ctx, ev) {
		return nil
	}
	return &ev
}

// eventOf is the event of type typ about st, At to be set by the caller. Every event
// carries what the queued request's headers say of its acceptance (ADR 18: no accepted
// event is stored), and a final event of a keyed request its body's digest, so that the
// key sent again with another body is refused once the request has left the queue.
func eventOf(st request.Stored, typ request.EventType) request.Event {
	ev := request.Event{Type: typ, ID: st.ID, ClientID: st.ClientID, Cycle: st.Cycle, Seq: st.Seq, NotBefore: st.NotBefore, NotAfter: st.NotAfter}
	if st.Cycle == 0 {
		ev.AcceptedAt = st.AcceptedAt
	}
	if ev.Final() {
		ev.BodyDigest = st.BodyDigest
	}
	return ev
}

// settleDelivered settles an attempt raven accepted: its delivered event, then its
// removal. False: the removal did not land (the dispatcher is stopping), and the request
// stays to be sent again later.
func (d *Dispatcher) settleDelivered(ctx context.Context, st request.Stored, attempt int, end time.Time, status int, answer *request.Response, sendBy time.Time) bool {
	var unwritten *request.Event
	if d.cfg.Events != nil {
		ev := eventOf(st, request.EventDelivered)
		ev.Attempt, ev.At, ev.Status, ev.Response = attempt, end, status, answer
		unwritten = d.writeNow(ctx, ev, sendBy)
	}
	if d.remove(ctx, st, sendBy, unwritten) != nil {
		return false
	}
	d.recent.add(introspect.Delivery{ID: st.ID, Subject: st.Subject, Attempt: attempt, Delivered: end})
	d.cfg.Metrics.delivered()
	return true
}

// recordFailed records an attempt that failed and will be retried, with raven's answer
// (cut to FailedAnswerBytes) or, without one, the error.
func (d *Dispatcher) recordFailed(st request.Stored, attempt int, end time.Time, status int, answer *request.Response, err error) {
	if d.cfg.Events == nil {
		return
	}
	ev := eventOf(st, request.EventAttemptFailed)
	ev.Attempt, ev.At, ev.Status = attempt, end, status
	ev.Response = answer.Cut(request.FailedAnswerBytes)
	if status == 0 {
		ev.Error = err.Error()
	}
	d.cfg.Events.Record(ev)
}
