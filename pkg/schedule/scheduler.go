package schedule

import (
	"container/heap"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// How soon a lane is looked at again after a failed queue read, or after it was held
// because its partition's lease was about to lapse.
const (
	failedRetry = time.Second
	heldRetry   = 50 * time.Millisecond
)

// Scheduler holds one lane per client with a backlog and says which may start an attempt
// when. It is not safe for concurrent use: one goroutine owns it, and passes the time in.
//
// Its one rule for spacing: a lane is never due sooner than Interval after its last
// attempt ended, whatever else (retry backoff, Retry-After, a fence) pushes it later.
//
// The interval can change while it runs (SetInterval, Steer): waiting lanes are moved to
// the new spacing at once, shorter or longer, and the rule holds with the interval in
// force when the lane is next handed out.
type Scheduler struct {
	policy   Policy
	lead     time.Duration
	rand     func() float64
	lanes    map[request.Lane]*lane
	waiting  laneHeap
	inFlight int
	steers   map[string]request.Steering // by client token (request.Lane's Token)
	// Fences from interval raises, for clients whose lane was already forgotten: their
	// last attempt may have ended as late as this. Global, and by client token.
	raised       time.Time
	clientRaised map[string]time.Time
}

// New returns an empty Scheduler. rand returns numbers in [0, 1) for jitter.
func New(p Policy, rand func() float64) *Scheduler {
	return &Scheduler{policy: p, rand: rand, lanes: make(map[request.Lane]*lane), steers: make(map[string]request.Steering), clientRaised: make(map[string]time.Time)}
}

// Interval is the global interval in force.
func (s *Scheduler) Interval() time.Duration { return s.policy.Interval }

// SetInterval changes the global interval at now; waiting lanes are rescheduled to it.
//
// A lane is forgotten once its client's interval has passed since its last attempt, so
// a raise could let a client without a lane send too soon: its last attempt may have
// ended as late as now minus the old interval. New lanes wait the new interval after
// that.
func (s *Scheduler) SetInterval(d time.Duration, now time.Time) {
	old := s.policy.Interval
	d = min(d, request.MaxInterval)
	if d <= 0 || d == old {
		return
	}
	if d > old {
		s.raised = Later(s.raised, now.Add(-old))
	}
	s.policy.Interval = d
	s.rescheduleWaiting(func(*lane) bool { return true })
}

// Steer sets at now how client (a lane's Token) is steered; the zero Steering
// clears it. A lane waiting is rescheduled to the client's interval; a parked lane, or
// one in flight, is looked at again, so that a resume or a purge takes effect. A raise
// of the client's interval fences a lane made later, as SetInterval does.
func (s *Scheduler) Steer(client string, st request.Steering, now time.Time) {
	old := s.intervalOfClient(client)
	// A new purge is for now: a lane whose head it reaches and that waits for the head's
	// Not-Before (or a retry's backoff) is looked at again as soon as spacing allows, to
	// dead-letter what was purged.
	purge := st.PurgeThrough > s.steers[client].PurgeThrough
	if st.IsZero() {
		delete(s.steers, client)
	} else {
		s.steers[client] = st
	}
	if s.intervalOfClient(client) > old {
		s.clientRaised[client] = Later(s.clientRaised[client], now.Add(-old))
	}
	for c, f := range s.clientRaised { // drop fences that can no longer matter
		if f.Add(s.intervalOfClient(c)).Before(now) {
			delete(s.clientRaised, c)
		}
	}
	mine := func(l *lane) bool { return l.key.Token == client }
	for _, l := range s.lanes {
		switch {
		case !mine(l):
		case purge && l.state == waiting && l.notBefore.After(now) && s.purges(l.key, l.headSeq):
			l.notBefore = now
		case l.state == parked:
			s.schedule(l, l.notBefore)
		case l.state == inFlight:
			l.state = inFlightStale // its worker had the old steering: look again
		}
	}
	s.rescheduleWaiting(mine)
}

// SteeringOf is the steering record in force for client; the zero record when none.
func (s *Scheduler) SteeringOf(client string) request.Steering { return s.steers[client] }

// IntervalOf is the interval in force for key's client.
func (s *Scheduler) IntervalOf(key request.Lane) time.Duration {
	if len(s.steers) == 0 {
		return s.policy.Interval
	}
	return s.intervalOfClient(key.Token)
}

func (s *Scheduler) intervalOfClient(client string) time.Duration {
	return s.intervalOf(s.steers[client])
}

// intervalOf is the interval in force for a client steered by st.
func (s *Scheduler) intervalOf(st request.Steering) time.Duration {
	if st.Interval > 0 {
		return min(time.Duration(st.Interval), request.MaxInterval)
	}
	return s.policy.Interval
}

func (s *Scheduler) steerOf(key request.Lane) request.Steering {
	if len(s.steers) == 0 {
		return request.Steering{}
	}
	return s.steers[key.Token]
}

func (s *Scheduler) rescheduleWaiting(match func(*lane) bool) {
	changed := false
	for _, l := range s.waiting {
		if match(l) {
			l.due = s.dueOf(l, l.notBefore)
			changed = true
		}
	}
	if changed {
		heap.Init(&s.waiting)
	}
}

// Lanes is how many clients the scheduler holds in memory.
func (s *Scheduler) Lanes() int { return len(s.lanes) }

// InFlight is how many lanes are with a worker.
func (s *Scheduler) InFlight() int { return s.inFlight }

// SetLead lets Due hand out lanes up to d before they are due (Job.SendAt), so that the
// worker reads the head request ahead of time. Zero (the default) hands out lanes when due.
func (s *Scheduler) SetLead(d time.Duration) { s.lead = d }

// Notify says key has (or may have) requests queued. since is the lane's fence: an
// attempt by an earlier owner of the client may have ended as late as since, so the
// first attempt waits until an interval after it (zero: no fence). A new lane is due at
// now or then; a lane already waiting, parked or in flight is left as it is.
func (s *Scheduler) Notify(key request.Lane, now, since time.Time) {
	l := s.lanes[key]
	switch {
	case l == nil:
		since = Later(since, s.raised)
		if len(s.clientRaised) > 0 {
			since = Later(since, s.clientRaised[key.Token])
		}
		l = &lane{key: key, index: -1, since: since}
		s.lanes[key] = l
		s.schedule(l, now)
	case l.state == inFlight:
		l.state = inFlightStale
	case l.state == idle:
		heap.Remove(&s.waiting, l.index)
		s.schedule(l, now)
	}
}

// DueBy counts the lanes waiting with something queued that are due by at.
func (s *Scheduler) DueBy(at time.Time) int {
	n := 0
	var walk func(i int)
	walk = func(i int) { // the heap's order: a lane due later has only later ones below it
		if i >= len(s.waiting) || s.waiting[i].due.After(at) {
			return
		}
		if s.waiting[i].state == waiting {
			n++
		}
		walk(2*i + 1)
		walk(2*i + 2)
	}
	walk(0)
	return n
}

// OverdueAfter is how many of its intervals a lane may be due without an attempt
// starting before it counts as overdue (Overdue).
const OverdueAfter = 3

// Overdue counts the lanes that have been due for longer than OverdueAfter intervals at
// now without an attempt starting: held back at every look (a lease that lapsed, a queue
// that fails reads), or never handed out (raven's budget binds, MaxInFlight is reached).
// It walks every lane: call it once in a while, not on every turn.
func (s *Scheduler) Overdue(now time.Time) int {
	n := 0
	for subj, l := range s.lanes {
		if l.state != waiting {
			continue
		}
		since := l.heldSince
		if since.IsZero() {
			since = l.due
		}
		if now.Sub(since) > OverdueAfter*s.IntervalOf(subj) {
			n++
		}
	}
	return n
}

// Next returns the earliest time Due may hand out a lane, and false when none waits.
func (s *Scheduler) Next() (time.Time, bool) {
	if len(s.waiting) == 0 {
		return time.Time{}, false
	}
	return s.waiting[0].due.Add(-s.lead), true
}

// Due hands out the next lane due by now plus the lead, marking it in flight. It returns
// false when none is.
func (s *Scheduler) Due(now time.Time) (Job, bool) {
	for len(s.waiting) > 0 && !s.waiting[0].due.After(now.Add(s.lead)) {
		l := heap.Pop(&s.waiting).(*lane)
		if l.state == idle {
			delete(s.lanes, l.key) // its interval has passed: forgetting it is safe
			continue
		}
		l.state = inFlight
		s.inFlight++
		st := s.steerOf(l.key)
		return Job{Lane: l.key, SendAt: l.due, HeadSeq: l.headSeq, Attempts: l.attempts, FirstAttempt: l.firstAttempt,
			PrevEnd: l.lastEnd, Interval: s.intervalOf(st), Since: l.since, Paused: st.Paused, PurgeThrough: st.PurgeThrough}, true
	}
	return Job{}, false
}

// Done takes a worker's Result back at now and decides when the lane is next due, or
// drops the lane when its client has nothing left.
func (s *Scheduler) Done(r Result, now time.Time) {
	l := s.lanes[r.Lane]
	if l == nil || !l.state.busy() {
		return
	}
	stale := l.state == inFlightStale
	s.inFlight--
	if r.Kind == Held || r.Kind == Failed {
		if l.heldSince.IsZero() {
			l.heldSince = l.due // the lane has been due since then, and no attempt started
		}
	} else {
		l.heldSince = time.Time{}
	}
	if !r.AttemptEnd.IsZero() {
		l.lastEnd = r.AttemptEnd
	}
	switch r.Kind {
	case Empty:
		switch {
		case stale:
			s.schedule(l, now)
		case l.lastEnd.IsZero() || !now.Before(l.lastEnd.Add(s.IntervalOf(l.key))):
			// Nothing queued, and the last attempt is at least an interval old, so
			// forgetting the lane cannot break spacing. (A fence is not lost with it:
			// the lane is made again with the partition's fence.)
			delete(s.lanes, r.Lane)
		default:
			// Looked early (the lead): keep the lane, so that a request arriving now
			// still waits out the interval, and forget it once the interval has passed.
			l.state = idle
			l.due = s.dueOf(l, now)
			heap.Push(&s.waiting, l)
		}
	case Delivered, DeadLettered:
		l.headSeq, l.attempts, l.firstAttempt = 0, 0, time.Time{}
		s.schedule(l, now)
	case Retry:
		l.headSeq, l.attempts, l.firstAttempt = r.Seq, r.Attempts, r.FirstAttempt
		if s.purges(l.key, r.Seq) { // asked for while the attempt was under way
			s.schedule(l, now)
			break
		}
		// The interval is not added here: schedule adds it, with the interval in force.
		s.schedule(l, l.lastEnd.Add(max(s.policy.Backoff(r.Attempts, s.rand()), r.RetryAfter)))
	case Parked:
		if s.steerOf(l.key).Paused && !stale {
			l.state, l.notBefore = parked, now
		} else { // resumed while the worker looked
			s.schedule(l, now)
		}
	case NotYet:
		// The head's attempts so far (none, as a rule) stay with it; its sequence is
		// kept so that a purge that reaches it need not wait for its time.
		if r.Seq != l.headSeq {
			l.headSeq, l.attempts, l.firstAttempt = r.Seq, 0, time.Time{}
		}
		if s.purges(l.key, r.Seq) { // asked for while the worker looked
			s.schedule(l, now)
			break
		}
		s.schedule(l, Later(r.NotBefore, now))
	case Failed:
		s.schedule(l, now.Add(failedRetry))
	case Held:
		// Past the lead, or Due would hand the lane straight back.
		s.schedule(l, now.Add(s.lead+heldRetry))
	}
}

// purges says whether the steering in force purges key's request seq: a purge its
// worker did not know of, since it reported that request back instead of purging it.
func (s *Scheduler) purges(key request.Lane, seq uint64) bool {
	return seq != 0 && seq <= s.steerOf(key).PurgeThrough
}

// Hold puts back a lane that Due just handed out and that may not start now after all:
// its client's partition was taken over at since, so it waits out the fence like a new
// lane.
func (s *Scheduler) Hold(key request.Lane, since time.Time) {
	l := s.lanes[key]
	if l == nil || !l.state.busy() {
		return
	}
	s.inFlight--
	l.since = Later(l.since, since)
	l.heldSince = time.Time{} // waiting out a fence is not a stall
	s.schedule(l, l.notBefore)
}

// Forget drops a lane whether it waits or was just handed out by Due; a lane with a
// worker must be handed back with Done first.
func (s *Scheduler) Forget(key request.Lane) {
	l := s.lanes[key]
	if l == nil {
		return
	}
	if l.state.busy() {
		s.inFlight--
	}
	if l.index >= 0 {
		heap.Remove(&s.waiting, l.index)
	}
	delete(s.lanes, key)
}

// ForgetWaiting drops every waiting lane that match selects; lanes in flight stay.
func (s *Scheduler) ForgetWaiting(match func(key request.Lane) bool) {
	for subj, l := range s.lanes {
		if !l.state.busy() && match(subj) {
			s.Forget(subj)
		}
	}
}

// schedule puts l in the heap, waiting, at notBefore, but never sooner than an interval
// after its last attempt ended or after its fence.
func (s *Scheduler) schedule(l *lane, notBefore time.Time) {
	l.state, l.notBefore = waiting, notBefore
	l.due = s.dueOf(l, notBefore)
	heap.Push(&s.waiting, l)
}

// dueOf is when l is due if nothing but spacing pushes it past notBefore, with the
// interval in force now.
func (s *Scheduler) dueOf(l *lane, notBefore time.Time) time.Time {
	iv := s.IntervalOf(l.key)
	if l.state == idle {
		return l.lastEnd.Add(iv + s.lead)
	}
	due := notBefore
	if !l.lastEnd.IsZero() {
		due = Later(due, l.lastEnd.Add(iv))
	}
	if !l.since.IsZero() {
		due = Later(due, l.since.Add(iv))
	}
	return due
}

// Later is the later of a and b.
func Later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
