package dispatch

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/retry"
	"github.com/penguinhq/dispatcher/pkg/tracing"
)

// Log messages that name a request (request_id) whose delivery raven may see twice.
// LogRemovalFailed: raven accepted it, but its removal from the queue failed at first;
// until the removal lands it may be sent again. LogRemovalLate: the removal landed, but
// after the partition's lease could have lapsed (the process was paused, the store slow),
// so that another instance may have sent it meanwhile. LogAttemptFailed: an attempt failed
// and will be retried; when it failed without raven's answer (a timeout), raven may have
// accepted it all the same, the other cause G5 names. Every duplicate raven sees follows
// one of these lines, or a dispatcher killed between raven's answer and the removal.
const (
	LogAttemptFailed = "attempt failed; will retry"
	LogRemovalFailed = "raven accepted the request but removing it from the queue failed; retrying, and until it lands the request may be sent again"
	LogRemovalLate   = "delivered request removed from the queue only after the partition's lease could have lapsed; another instance may have sent it again"
)

// startDue hands every lane that is due (up to MaxInFlight) to a worker of its own, or
// holds it when its partition does not let attempts start now.
func (l *loop) startDue() {
	now := l.d.now()
	g := l.d.gov
	g.held = false // until this look holds a lane back: the loop's timer depends on it
	if g.needsCount(now) {
		l.countOpen(now)
	}
	for l.sched.InFlight() < l.d.cfg.MaxInFlight {
		if next, ok := l.sched.Next(); !ok || next.After(now) {
			g.countWaiting(now, func() int { return 0 })
			return // nothing due: the budget holds nothing back
		}
		if !g.mayStart(now, l.sched.InFlight()) {
			// Raven's budget holds the lanes that are due back, longest-waiting first
			// when it lets one go: the heap's order.
			g.countWaiting(now, func() int { return l.sched.DueBy(now) })
			return
		}
		job, ok := l.sched.Due(now)
		if !ok {
			return
		}
		p, part := l.owner(job.Subject)
		switch {
		case part == nil:
			l.sched.Forget(job.Subject)
		case job.Since.Before(part.since):
			// A lane that outlived an earlier holding of the partition: it waits out the
			// fence like a new one.
			l.sched.Hold(job.Subject, part.since)
		case lapsed(part.validUntil, now):
			// The lease is not renewed yet: the same as a worker finding so.
			l.sched.Done(Result{Subject: job.Subject, Kind: Held}, now)
		default:
			part.inFlight++
			token := g.started(now, job.SendAt)
			sendBy := part.validUntil // read here: the loop moves it on as leases are renewed
			go func() { l.results <- outcome{Result: l.d.work(l.workCtx, job, sendBy), partition: p, token: token} }()
		}
	}
}

// work looks at one client's head request and makes one attempt.
//
// sendBy is when the partition's lease could lapse (zero: never); an attempt that could
// not start by then is not made and the lane is held.
func (d *Dispatcher) work(ctx context.Context, job Job, sendBy time.Time) Result {
	gen := d.sending.look() // before the head is read: see sending
	st, ok, err := d.src.Head(ctx, job.Subject)
	var undecodable interface{ Undecodable() bool }
	switch {
	case errors.As(err, &undecodable) && undecodable.Undecodable():
		d.log.Warn().Str("subject", job.Subject).Uint64("seq", st.Seq).Msg("message not written by ingest; dead-lettering it unsent")
		return d.bury(ctx, job, st, request.Verdict{Reason: request.ReasonUndecodable, LastError: err.Error()}, sendBy)
	case err != nil:
		d.log.Debug().Err(err).Str("subject", job.Subject).Msg("reading head request failed; will look again")
		return Result{Subject: job.Subject, Kind: Failed}
	case !ok:
		return Result{Subject: job.Subject, Kind: Empty}
	case st.Seq <= job.PurgeThrough:
		// An operator purged the client's backlog up to here.
		if !d.sending.commit(job.Subject, st.ID, gen) {
			return Result{Subject: job.Subject, Kind: Failed} // a cancel took it, or may have
		}
		defer d.sending.settled(job.Subject)
		return d.unsent(ctx, job, st, request.ReasonPurged, sendBy, "request purged to the dead-letter stream")
	case job.Paused:
		return Result{Subject: job.Subject, Kind: Parked}
	case st.NotBefore.After(job.SendAt):
		// Not before its time: the lane waits, and its client's later requests with it.
		return Result{Subject: job.Subject, Kind: NotYet, Seq: st.Seq, NotBefore: st.NotBefore}
	}
	// The head was read up to the scheduler's lead in advance: start on time, not before.
	if !sleepUntil(ctx, d.now, job.SendAt) {
		return Result{Subject: job.Subject, Kind: Failed}
	}
	if !d.sending.commit(job.Subject, st.ID, gen) {
		return Result{Subject: job.Subject, Kind: Failed} // a cancel took it, or may have: read the head again
	}
	defer d.sending.settled(job.Subject)
	if st.Expired(d.now()) {
		// Its Not-After passed before this attempt could start: never sent (an attempt
		// already under way at the deadline was not cut short).
		return d.unsent(ctx, job, st, request.ReasonExpired, sendBy, "request expired (Not-After) unsent; dead-lettered")
	}
	if lapsed(sendBy, d.now()) {
		return Result{Subject: job.Subject, Kind: Held}
	}
	return d.attempt(ctx, job, st, sendBy)
}

// unsent dead-letters st without an attempt, for reason, and logs msg when it did. No
// attempt is made, so the lane's spacing is untouched. Like a send, it is only started
// while the partition is surely ours.
func (d *Dispatcher) unsent(ctx context.Context, job Job, st request.Stored, reason string, sendBy time.Time, msg string) Result {
	if lapsed(sendBy, d.now()) {
		return Result{Subject: job.Subject, Kind: Held}
	}
	res := d.bury(ctx, job, st, request.Verdict{Reason: reason, Attempts: attemptsOf(job, st)}, sendBy)
	if res.Kind == DeadLettered {
		d.log.Info().Str("client_id", st.ClientID).Str("request_id", st.ID).Func(tracing.Log(st.TraceParent)).Msg(msg)
	}
	return res
}

// sleepUntil waits until t by now's clock; false when ctx ended first.
func sleepUntil(ctx context.Context, now clock, t time.Time) bool {
	wait := t.Sub(now())
	if wait <= 0 {
		return true
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// attempt sends st to raven once, and acts on the answer: removes it, dead-letters it, or
// has the lane retry it.
func (d *Dispatcher) attempt(ctx context.Context, job Job, st request.Stored, sendBy time.Time) Result {
	attempt, first := attemptsOf(job, st)+1, time.Time{}
	if st.Seq == job.HeadSeq {
		first = job.FirstAttempt
	}
	start := d.now()
	if first.IsZero() {
		first = start
	}
	startedWritten := d.recordStarted(st, attempt, start)
	sendCtx, span := d.startAttempt(ctx, job, st, attempt, start)
	status, answer, err := d.send(sendCtx, st, attempt)
	end := d.now()
	startedWritten()
	judged := judge(err)
	deadReason := "" // set below when this attempt dead-letters the request
	if span != nil {
		defer func() { endAttempt(span, judged, status, err, deadReason) }()
	}
	d.cfg.Metrics.attempt(start, end, job.PrevEnd, job.Interval, judged)
	d.noteAttempt(job, st, attempt, start, end, judged, status, err)
	// Fields are added per event, not through a child logger: no allocation per attempt
	// when the level is off.
	about := func(ev *zerolog.Event) *zerolog.Event {
		return ev.Str("client_id", st.ClientID).Str("request_id", st.ID).Func(tracing.Log(st.TraceParent)).Int("attempt", attempt)
	}
	if ev := d.log.Debug(); ev.Enabled() {
		if !job.PrevEnd.IsZero() {
			ev = ev.Int64("gap_ms", start.Sub(job.PrevEnd).Milliseconds())
		}
		about(ev).Dur("took", end.Sub(start)).Err(err).Msg("attempt")
	}

	res := Result{Subject: job.Subject, AttemptEnd: end, Took: end.Sub(start)}
	why := request.Verdict{Attempts: attempt, FirstAttempt: first, LastAttempt: start, LastStatus: statusOf(err), Answer: answer}
	res.Refused, res.PauseAll = overloaded(err, why.LastStatus)
	switch judged {
	case OutcomeDelivered:
		var unwritten *request.Event
		if d.cfg.Events != nil {
			ev := eventOf(st, request.EventDelivered)
			ev.Attempt, ev.At, ev.Status, ev.Response = attempt, end, status, answer
			unwritten = d.writeNow(ctx, ev, sendBy)
		}
		if d.remove(ctx, st, sendBy, unwritten) != nil {
			res.Kind = Failed // shutting down; the request stays and is sent again later
			return res
		}
		d.recent.add(Delivery{ID: st.ID, Subject: st.Subject, Attempt: attempt, Delivered: end})
		if ev := d.log.Debug(); ev.Enabled() {
			about(ev).Msg("request delivered")
		}
		d.cfg.Metrics.delivered()
		res.Kind = Delivered
		return res
	case OutcomePermanent:
		why.Reason = request.ReasonPermanent
	default:
		if why.Reason = d.cfg.GiveUp(attempt, first, end); why.Reason == "" {
			var ra interface{ RetryAfter() time.Duration }
			if errors.As(err, &ra) {
				res.RetryAfter = ra.RetryAfter()
			}
			res.Kind, res.Seq, res.Attempts, res.FirstAttempt = Retry, st.Seq, attempt, first
			about(d.log.Info()).Err(err).Dur("retry_after", res.RetryAfter).Msg(LogAttemptFailed)
			if d.cfg.Events != nil {
				ev := eventOf(st, request.EventAttemptFailed)
				ev.Attempt, ev.At, ev.Status = attempt, end, why.LastStatus
				ev.Response = answer.Cut(request.FailedAnswerBytes)
				if why.LastStatus == 0 {
					ev.Error = err.Error()
				}
				d.cfg.Events.Record(ev)
			}
			return res
		}
	}
	if why.LastStatus == 0 {
		why.LastError = err.Error()
	}
	if d.finish(ctx, st, why, sendBy) != nil {
		res.Kind = Failed
		return res
	}
	d.deadLettered(why.Reason)
	deadReason = why.Reason
	about(d.log.Warn()).Str("reason", why.Reason).Int("last_status", why.LastStatus).Msg("request dead-lettered")
	res.Kind = DeadLettered
	return res
}

// judge says what an attempt's error means: delivered (nil), a permanent failure (an
// error whose Permanent() says so), or a transient one. It is made here only, for the
// decision and for the metrics alike.
func judge(err error) string {
	var perm interface{ Permanent() bool }
	switch {
	case err == nil:
		return OutcomeDelivered
	case errors.As(err, &perm) && perm.Permanent():
		return OutcomePermanent
	default:
		return OutcomeTransient
	}
}

// bury dead-letters st unsent, for why, and says so in the result.
func (d *Dispatcher) bury(ctx context.Context, job Job, st request.Stored, why request.Verdict, sendBy time.Time) Result {
	if d.finish(ctx, st, why, sendBy) != nil {
		return Result{Subject: job.Subject, Kind: Failed}
	}
	d.deadLettered(why.Reason)
	return Result{Subject: job.Subject, Kind: DeadLettered}
}

// remove deletes a delivered request from the queue, retrying until it lands or ctx ends
// (shutdown), after keeping its final event in the queue if the events did not take it
// (unwritten, nil when they did). A failure, or a removal that lands after the lease
// could have lapsed (sendBy, zero without leases), is logged with the request's id and
// counted: these are what make a duplicate possible.
func (d *Dispatcher) remove(ctx context.Context, st request.Stored, sendBy time.Time, unwritten *request.Event) error {
	del := d.keepThenDelete(st, unwritten)
	err := del(ctx)
	if err == nil {
		if !sendBy.IsZero() && d.now().After(sendBy.Add(d.cfg.leaseMargin())) {
			d.cfg.Metrics.removalFailed()
			d.log.Warn().Str("client_id", st.ClientID).Str("request_id", st.ID).Func(tracing.Log(st.TraceParent)).Msg(LogRemovalLate)
		}
		return nil
	}
	d.cfg.Metrics.removalFailed()
	d.log.Warn().Err(err).Str("client_id", st.ClientID).Str("request_id", st.ID).Func(tracing.Log(st.TraceParent)).Msg(LogRemovalFailed)
	if err := d.retry(ctx, true, func() error { return del(ctx) }); err != nil {
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
		return del(ctx)
	})
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
		return d.src.Delete(ctx, st.Seq)
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

// eventOf is the event of type typ about st, At to be set by the caller.
func eventOf(st request.Stored, typ string) request.Event {
	ev := request.Event{Type: typ, ID: st.ID, ClientID: st.ClientID, Cycle: st.Cycle, Seq: st.Seq, NotBefore: st.NotBefore, NotAfter: st.NotAfter}
	if st.Cycle == 0 {
		ev.AcceptedAt = st.AcceptedAt
	}
	return ev
}

// attemptsOf is how many attempts of st this dispatcher made so far: those of the lane's
// head when st is still it.
func attemptsOf(job Job, st request.Stored) int {
	if st.Seq == job.HeadSeq {
		return job.Attempts
	}
	return 0
}

// send makes the attempt, and gives raven's status and its answer as the record keeps
// it when the Sender tells them (an AnswerSender).
func (d *Dispatcher) send(ctx context.Context, st request.Stored, attempt int) (int, *request.Response, error) {
	if s, ok := d.snd.(AnswerSender); ok {
		answer, err := s.SendAnswer(ctx, st, attempt)
		if answer != nil {
			return answer.Status, answer, err
		}
		return statusOf(err), nil, err
	}
	err := d.snd.Send(ctx, st, attempt)
	return statusOf(err), nil, err
}

// retry runs op until it succeeds or ctx ends, backing off up to 2s between tries. The
// queue being briefly unreachable must not turn a delivered request into a resent one.
//
// logged says the caller has logged the first failure already: the tries then warn of
// nothing themselves.
func (d *Dispatcher) retry(ctx context.Context, logged bool, op func() error) error {
	p := retry.Policy{First: 50 * time.Millisecond, Max: 2 * time.Second, OnFail: func(try int, err error, wait time.Duration) {
		// The first failure is a warning, with its cause; the retries after it are debug
		// (a line per retry per request would say the same many times), and a success
		// after them says so.
		ev := d.log.Debug()
		if try == 1 && !logged {
			ev = d.log.Warn()
		}
		ev.Err(err).Dur("retry_in", wait).Msg("queue operation failed; retrying")
	}}
	tries, err := retry.Do(ctx, p, func(context.Context) error { return op() })
	if err == nil && tries > 1 {
		d.log.Info().Int("tries", tries).Msg("queue operation succeeded after retrying")
	}
	return err
}

// overloaded says whether an attempt's failure says raven is overloaded (429, 503, or
// a timeout), and for a 503 with Retry-After how long raven asked every sender to wait.
func overloaded(err error, status int) (bool, time.Duration) {
	var timeout interface{ Timeout() bool }
	switch {
	case err == nil:
		return false, 0
	case status == http.StatusServiceUnavailable:
		var ra interface{ RetryAfter() time.Duration }
		if errors.As(err, &ra) {
			return true, ra.RetryAfter()
		}
		return true, 0
	case status == http.StatusTooManyRequests:
		return true, 0
	case status == 0 && (errors.Is(err, context.DeadlineExceeded) || errors.As(err, &timeout) && timeout.Timeout()):
		return true, 0
	}
	return false, 0
}

func statusOf(err error) int {
	var sc interface{ StatusCode() int }
	if errors.As(err, &sc) {
		return sc.StatusCode()
	}
	return 0
}

// noteAttempt remembers an attempt for the console (Activity and the client's history).
func (d *Dispatcher) noteAttempt(job Job, st request.Stored, attempt int, start, end time.Time, outcome string, status int, err error) {
	if err != nil {
		status = statusOf(err)
	}
	at := Attempt{ID: st.ID, Attempt: attempt, Start: start, End: end, Interval: job.Interval, Outcome: outcome, Status: status}
	if !job.PrevEnd.IsZero() {
		at.Gap, at.HasGap = start.Sub(job.PrevEnd), true
	}
	d.activity.attempt(job.Subject, at)
}

// deadLettered counts a dead letter for reason, in the metrics and the Activity.
func (d *Dispatcher) deadLettered(reason string) {
	d.cfg.Metrics.deadLettered(reason)
	d.activity.deadLettered(reason, d.now())
}

// startAttempt starts an attempt's span, a child of the trace context stored with the
// request (the accept span, or the replay's); an attempt after the first also links to
// it, as a retry. Tracing off: ctx as it is and no span.
func (d *Dispatcher) startAttempt(ctx context.Context, job Job, st request.Stored, attempt int, start time.Time) (context.Context, trace.Span) {
	if d.tracer == nil {
		return ctx, nil
	}
	ctx, parent := tracing.Extract(ctx, st.TraceParent, st.TraceState)
	// How long it waited in its lane before this attempt: since it was accepted (or
	// requeued), or since its previous attempt ended.
	since := st.AcceptedAt
	if attempt > 1 && job.PrevEnd.After(since) {
		since = job.PrevEnd
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(start),
		trace.WithAttributes(attribute.String("dispatch.request_id", st.ID), attribute.Int("dispatch.attempt", attempt),
			attribute.Int("dispatch.cycle", st.Cycle), attribute.Float64("dispatch.waited_seconds", max(0, start.Sub(since).Seconds())))}
	if attempt > 1 && parent.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: parent, Attributes: []attribute.KeyValue{attribute.String("dispatch.link", "retry")}}))
	}
	return d.tracer.Start(ctx, "dispatch.attempt", opts...)
}

// endAttempt ends an attempt's span with its outcome, raven's status, and the
// dead-lettering it led to, if it did.
func endAttempt(span trace.Span, outcome string, status int, err error, deadReason string) {
	span.SetAttributes(attribute.String("dispatch.outcome", outcome))
	if status != 0 {
		span.SetAttributes(attribute.Int("http.response.status_code", status))
	}
	if err != nil {
		span.SetStatus(codes.Error, outcome)
	}
	if deadReason != "" {
		span.AddEvent("dispatch.dead_lettered", trace.WithAttributes(attribute.String("dispatch.reason", deadReason)))
	}
	span.End()
}
