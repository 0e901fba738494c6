package dispatch

import (
	"context"
	"errors"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/retry"
	"github.com/penguinhq/dispatcher/pkg/schedule"
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

// LogRemovedBefore names a delivered request that was no longer in the queue when its
// removal came, within the lease: it had been removed before this attempt, so raven may
// have received it twice. No known cause is left (the last, a head read through a NATS
// server cut off from its cluster, is closed by the queue's proven links); the line is
// there to find the next. (Gone when the lease could have lapsed is LogRemovalLate's.)
const LogRemovedBefore = "delivered request was gone from the queue when its removal came: it had been removed before this attempt, and raven may have received it twice"

// startDue hands every lane that is due (up to MaxInFlight) to a worker of its own, or
// holds it when its partition does not let attempts start now.
func (l *loop) startDue() {
	now := l.d.now()
	g := l.d.gov
	g.Look() // the loop's timer depends on whether this look holds a lane back
	if g.NeedsCount(now) {
		l.countOpen(now)
	}
	for l.sched.InFlight() < l.d.cfg.MaxInFlight {
		if next, ok := l.sched.Next(); !ok || next.After(now) {
			g.CountWaiting(now, func() int { return 0 })
			return // nothing due: the budget holds nothing back
		}
		if !g.MayStart(now, l.sched.InFlight()) {
			// Raven's budget holds the lanes that are due back, longest-waiting first
			// when it lets one go: the heap's order.
			g.CountWaiting(now, func() int { return l.sched.DueBy(now) })
			return
		}
		job, ok := l.sched.Due(now)
		if !ok {
			return
		}
		p, part := l.owner(job.Lane)
		switch {
		case part == nil:
			l.sched.Forget(job.Lane)
		case job.Since.Before(part.since):
			// A lane that outlived an earlier holding of the partition: it waits out the
			// fence like a new one.
			l.sched.Hold(job.Lane, part.since)
		case lapsed(part.validUntil, now):
			// The lease is not renewed yet: the same as a worker finding so.
			l.sched.Done(schedule.Result{Lane: job.Lane, Kind: schedule.Held}, now)
		default:
			part.inFlight++
			token := g.Started(now, job.SendAt)
			sendBy := part.validUntil // read here: the loop moves it on as leases are renewed
			go func() { l.results <- finished{Result: l.d.work(l.workCtx, job, sendBy), partition: p, token: token} }()
		}
	}
}

// work looks at one client's head request and makes one attempt.
//
// sendBy is when the partition's lease could lapse (zero: never); an attempt that could
// not start by then is not made and the lane is held.
func (d *Dispatcher) work(ctx context.Context, job schedule.Job, sendBy time.Time) schedule.Result {
	gen := d.sending.look() // before the head is read: see sending
	st, ok, err := d.src.Head(ctx, job.Lane)
	var undecodable *request.UndecodableError
	switch {
	case errors.As(err, &undecodable):
		d.log.Warn().Stringer("subject", job.Lane).Uint64("seq", st.Seq).Msg("message not written by ingest; dead-lettering it unsent")
		return d.bury(ctx, job, st, request.Verdict{Reason: request.ReasonUndecodable, LastError: err.Error()}, sendBy)
	case err != nil:
		d.log.Debug().Err(err).Stringer("subject", job.Lane).Msg("reading head request failed; will look again")
		return schedule.Result{Lane: job.Lane, Kind: schedule.Failed}
	case !ok:
		return schedule.Result{Lane: job.Lane, Kind: schedule.Empty}
	case st.Seq <= job.PurgeThrough:
		// An operator purged the client's backlog up to here.
		if !d.sending.commit(job.Lane, st.ID, gen) {
			return schedule.Result{Lane: job.Lane, Kind: schedule.Failed} // a cancel took it, or may have
		}
		defer d.sending.settled(job.Lane)
		return d.unsent(ctx, job, st, request.ReasonPurged, sendBy, "request purged to the dead-letter stream")
	case job.Paused:
		return schedule.Result{Lane: job.Lane, Kind: schedule.Parked}
	case st.NotBefore.After(job.SendAt):
		// Not before its time: the lane waits, and its client's later requests with it.
		return schedule.Result{Lane: job.Lane, Kind: schedule.NotYet, Seq: st.Seq, NotBefore: st.NotBefore}
	}
	if read, ok := d.inherited(ctx, job, st, sendBy); ok {
		// The read took time: a cancel let go meanwhile must not be missed, nor starve
		// this head (sending keeps a lead's worth of them), so look again and read the
		// head again after it.
		gen = d.sending.look()
		again, ok, err := d.src.Head(ctx, job.Lane)
		if err != nil || !ok || again.Seq != st.Seq {
			return schedule.Result{Lane: job.Lane, Kind: schedule.Failed} // the lane looks again
		}
		// A count at MaxAttempts came from the last attempt's attempt_started: its outcome
		// is unknown (raven may have taken it), so it gets one more attempt, as before.
		job = read
	}
	// The head was read up to the scheduler's lead in advance: start on time, not before.
	if !sleepUntil(ctx, d.now, job.SendAt) {
		return schedule.Result{Lane: job.Lane, Kind: schedule.Failed}
	}
	if !d.sending.commit(job.Lane, st.ID, gen) {
		return schedule.Result{Lane: job.Lane, Kind: schedule.Failed} // a cancel took it, or may have: read the head again
	}
	defer d.sending.settled(job.Lane)
	if st.Expired(d.now()) {
		// Its Not-After passed before this attempt could start: never sent (an attempt
		// already under way at the deadline was not cut short).
		return d.unsent(ctx, job, st, request.ReasonExpired, sendBy, "request expired (Not-After) unsent; dead-lettered")
	}
	if lapsed(sendBy, d.now()) {
		return schedule.Result{Lane: job.Lane, Kind: schedule.Held}
	}
	return d.attempt(ctx, job, st, sendBy)
}

// unsent dead-letters st without an attempt, for reason, and logs msg when it did. No
// attempt is made, so the lane's spacing is untouched. Like a send, it is only started
// while the partition is surely ours.
func (d *Dispatcher) unsent(ctx context.Context, job schedule.Job, st request.Stored, reason request.Reason, sendBy time.Time, msg string) schedule.Result {
	if lapsed(sendBy, d.now()) {
		return schedule.Result{Lane: job.Lane, Kind: schedule.Held}
	}
	res := d.bury(ctx, job, st, request.Verdict{Reason: reason, Attempts: attemptsOf(job, st)}, sendBy)
	if res.Kind == schedule.DeadLettered {
		d.log.Info().Str("client_id", st.ClientID).Str("request_id", st.ID).Func(tracing.Log(st.TraceParent)).Msg(msg)
	}
	return res
}

// attemptsReadTimeout bounds the read of a head's earlier attempts: past it the count
// goes on from what was found (from one at worst, as before they were read). A lease
// that could lapse sooner bounds it to half the time left.
const attemptsReadTimeout = 2 * time.Second

// minAttemptsRead is the least time the read is given.
const minAttemptsRead = 50 * time.Millisecond

// takeoverClockMargin is how much later than the lane's fence (this instance's clock) a
// head may have been queued (the store's clock) and still be read for earlier attempts:
// the two clocks may be apart.
const takeoverClockMargin = time.Second

// inherited is job with the attempts an earlier owner of the client made of st, read
// from the record (Config.Attempts), and true, when it may have made some: the lane has
// made no attempt since its fence (when this instance took the client, or took it
// again), and st was queued before the fence (give or take the clocks apart). Only the
// head at a takeover can have been attempted by another owner (G3: its successor waits
// for it), so this is one read per lane and takeover (again after a turn that made no
// attempt). The count is the higher of the record's and the lane's own, for the same
// head. Without it, each takeover or restart gave a failing request MaxAttempts and
// MaxAge afresh, and one that kept failing could hold its client's queue for as long as
// the dispatchers kept moving.
func (d *Dispatcher) inherited(ctx context.Context, job schedule.Job, st request.Stored, sendBy time.Time) (schedule.Job, bool) {
	if d.cfg.Attempts == nil || !job.PrevEnd.Before(job.Since) || !st.AcceptedAt.Before(job.Since.Add(takeoverClockMargin)) {
		return job, false
	}
	timeout := attemptsReadTimeout
	if !sendBy.IsZero() {
		// A lease about to lapse holds the attempt afterwards all the same.
		timeout = max(min(timeout, sendBy.Sub(d.now())/2), minAttemptsRead)
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	n, at, err := d.cfg.Attempts.EarlierAttempts(rctx, st)
	if err != nil && ctx.Err() == nil {
		d.log.Warn().Err(err).Str("client_id", st.ClientID).Str("request_id", st.ID).Int("attempts_found", n).
			Msg("could not read the head's earlier attempts; counting from those found")
	}
	if st.Seq != job.HeadSeq {
		job.HeadSeq, job.Attempts, job.FirstAttempt = st.Seq, 0, time.Time{}
	}
	if n > job.Attempts {
		job.Attempts = n
		if job.FirstAttempt.IsZero() || at.Before(job.FirstAttempt) {
			job.FirstAttempt = at
		}
		d.log.Info().Str("client_id", st.ClientID).Str("request_id", st.ID).Int("attempts", n).Time("attempted_at", at).
			Msg("head request taken over after earlier attempts; counting on from them")
	}
	return job, true
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

// attempt sends st to raven once, and acts on the answer as schedule.Policy.Decide
// decides: removes it, dead-letters it, or has the lane retry it.
func (d *Dispatcher) attempt(ctx context.Context, job schedule.Job, st request.Stored, sendBy time.Time) schedule.Result {
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
	dec := d.cfg.Decide(err, attempt, first, end)
	var deadReason request.Reason // set below when this attempt dead-letters the request
	if span != nil {
		defer func() { endAttempt(span, dec.Outcome, status, err, deadReason) }()
	}
	d.cfg.Metrics.attempt(start, end, job.PrevEnd, job.Interval, dec.Outcome)
	d.noteAttempt(job, st, attempt, start, end, dec.Outcome, status, err)
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

	res := schedule.Result{Lane: job.Lane, AttemptEnd: end, Took: end.Sub(start), Refused: dec.Refused, PauseAll: dec.PauseAll}
	switch dec.Kind {
	case schedule.Delivered:
		if !d.settleDelivered(ctx, st, attempt, end, status, answer, sendBy) {
			res.Kind = schedule.Failed // shutting down; the request stays and is sent again later
			return res
		}
		if ev := d.log.Debug(); ev.Enabled() {
			about(ev).Msg("request delivered")
		}
		res.Kind = schedule.Delivered
		return res
	case schedule.Retry:
		res.Kind, res.Seq, res.Attempts, res.FirstAttempt, res.RetryAfter = schedule.Retry, st.Seq, attempt, first, dec.RetryAfter
		about(d.log.Info()).Err(err).Dur("retry_after", res.RetryAfter).Msg(LogAttemptFailed)
		d.recordFailed(st, attempt, end, request.RavenStatus(err), answer, err)
		return res
	}
	why := request.Verdict{Reason: dec.Reason, Attempts: attempt, FirstAttempt: first, LastAttempt: start, LastStatus: request.RavenStatus(err), Answer: answer}
	if why.LastStatus == 0 {
		why.LastError = err.Error()
	}
	if d.finish(ctx, st, why, sendBy) != nil {
		res.Kind = schedule.Failed
		return res
	}
	d.deadLettered(why.Reason)
	deadReason = why.Reason
	about(d.log.Warn()).Str("reason", string(why.Reason)).Int("last_status", why.LastStatus).Msg("request dead-lettered")
	res.Kind = schedule.DeadLettered
	return res
}

// attemptsOf is how many attempts of st this dispatcher made so far: those of the lane's
// head when st is still it.
func attemptsOf(job schedule.Job, st request.Stored) int {
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
		return request.RavenStatus(err), nil, err
	}
	err := d.snd.Send(ctx, st, attempt)
	return request.RavenStatus(err), nil, err
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
