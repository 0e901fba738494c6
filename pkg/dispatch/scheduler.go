package dispatch

import (
	"container/heap"
	"strings"
	"time"
)

// Job is one lane handed to a worker: look at the client's head request and, if there is
// one, make one attempt, starting it no sooner than SendAt.
type Job struct {
	Subject string
	// SendAt is the earliest the attempt may start. A job is handed out up to the
	// scheduler's lead before it, so that the head request is read in advance and the
	// attempt starts on time whatever the queue's latency.
	SendAt time.Time
	// HeadSeq, Attempts and FirstAttempt describe earlier failed attempts of the request
	// that was at the head last time; Attempts is 0 when there were none.
	HeadSeq      uint64
	Attempts     int
	FirstAttempt time.Time
	// PrevEnd is when the client's previous attempt ended; zero if none is remembered.
	PrevEnd time.Time
	// Since is the lane's fence: an attempt by an earlier owner of the client may have
	// ended as late as this (zero: none can have).
	Since time.Time
	// Paused says the client is paused: the worker sends nothing, only purges.
	Paused bool
	// PurgeThrough asks the worker to dead-letter, unsent, every request of the client
	// with a sequence up to this one (0: none).
	PurgeThrough uint64
}

// Kind says how a Job ended.
type Kind int

// The ways a Job ends.
const (
	// Empty: the client has nothing queued.
	Empty Kind = iota
	// Delivered: raven accepted the head request and it was removed.
	Delivered
	// Retry: the attempt failed transiently; the request stays at the head.
	Retry
	// DeadLettered: the request was moved to the dead-letter stream and removed.
	DeadLettered
	// Failed: the queue could not be read; nothing was sent.
	Failed
	// Held: nothing was sent because the partition's lease might lapse first.
	Held
	// Parked: the client is paused and has nothing to purge; the lane waits for a resume.
	Parked
)

// Result is what a worker reports back for a Job.
type Result struct {
	Subject string
	Kind    Kind
	// For Retry: the request's sequence, the attempt number just made and when the first
	// attempt started.
	Seq          uint64
	Attempts     int
	FirstAttempt time.Time
	// AttemptEnd is when the HTTP attempt ended; zero when no attempt was made.
	AttemptEnd time.Time
	// RetryAfter is raven's Retry-After for a Retry, zero when it gave none.
	RetryAfter time.Duration
}

// How soon a lane is looked at again after a failed queue read, or after it was held
// because its partition's lease was about to lapse.
const (
	failedRetry = time.Second
	heldRetry   = 50 * time.Millisecond
)

type lane struct {
	subject      string
	due          time.Time
	notBefore    time.Time // what asked for due, before spacing pushed it later
	index        int       // position in the heap; -1 when not waiting
	inFlight     bool
	notified     bool // a request arrived while in flight
	expiring     bool // waiting only to be forgotten, once an interval has passed since lastEnd
	parked       bool // paused: neither waiting nor in flight until resumed
	lastEnd      time.Time
	since        time.Time // the fence: an earlier owner's attempt may have ended this late
	headSeq      uint64
	attempts     int
	firstAttempt time.Time
}

// Steer is how an operator steers one client; the zero Steer leaves it to the defaults.
type Steer struct {
	// Interval replaces the global interval for this client when positive.
	Interval time.Duration
	// Paused stops sends to the client until it is resumed; its requests wait.
	Paused bool
	// PurgeThrough dead-letters, unsent, the client's requests up to this sequence.
	PurgeThrough uint64
}

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
	lanes    map[string]*lane
	waiting  laneHeap
	inFlight int
	steers   map[string]Steer // by client token (the subject's last token)
	// Fences from interval raises, for clients whose lane was already forgotten: their
	// last attempt may have ended as late as this. Global, and by client token.
	raised       time.Time
	clientRaised map[string]time.Time
}

// NewScheduler returns an empty Scheduler. rand returns numbers in [0, 1) for jitter.
func NewScheduler(p Policy, rand func() float64) *Scheduler {
	return &Scheduler{policy: p, rand: rand, lanes: make(map[string]*lane), steers: make(map[string]Steer), clientRaised: make(map[string]time.Time)}
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
	if d <= 0 || d == old {
		return
	}
	if d > old {
		s.raised = later(s.raised, now.Add(-old))
	}
	s.policy.Interval = d
	s.rescheduleWaiting(func(*lane) bool { return true })
}

// Steer sets at now how client (a subject's last token) is steered; the zero Steer
// clears it. A lane waiting is rescheduled to the client's interval; a parked lane, or
// one in flight, is looked at again, so that a resume or a purge takes effect. A raise
// of the client's interval fences a lane made later, as SetInterval does.
func (s *Scheduler) Steer(client string, st Steer, now time.Time) {
	old := s.intervalOfClient(client)
	if st == (Steer{}) {
		delete(s.steers, client)
	} else {
		s.steers[client] = st
	}
	if s.intervalOfClient(client) > old {
		s.clientRaised[client] = later(s.clientRaised[client], now.Add(-old))
	}
	for c, f := range s.clientRaised { // drop fences that can no longer matter
		if f.Add(s.intervalOfClient(c)).Before(now) {
			delete(s.clientRaised, c)
		}
	}
	mine := func(l *lane) bool { return clientOf(l.subject) == client }
	for _, l := range s.lanes {
		switch {
		case !mine(l):
		case l.parked:
			l.parked = false
			s.schedule(l, l.notBefore)
		case l.inFlight:
			l.notified = true // its worker had the old steering: look again
		}
	}
	s.rescheduleWaiting(mine)
}

// IntervalOf is the interval in force for subject's client.
func (s *Scheduler) IntervalOf(subject string) time.Duration {
	if len(s.steers) == 0 {
		return s.policy.Interval
	}
	return s.intervalOfClient(clientOf(subject))
}

func (s *Scheduler) intervalOfClient(client string) time.Duration {
	if st, ok := s.steers[client]; ok && st.Interval > 0 {
		return st.Interval
	}
	return s.policy.Interval
}

func (s *Scheduler) steerOf(subject string) Steer {
	if len(s.steers) == 0 {
		return Steer{}
	}
	return s.steers[clientOf(subject)]
}

func clientOf(subject string) string { return subject[strings.LastIndexByte(subject, '.')+1:] }

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

// Notify says subject has (or may have) requests queued. since is the lane's fence: an
// attempt by an earlier owner of the client may have ended as late as since, so the
// first attempt waits until an interval after it (zero: no fence). A new lane is due at
// now or then; a lane already waiting, parked or in flight is left as it is.
func (s *Scheduler) Notify(subject string, now, since time.Time) {
	l := s.lanes[subject]
	switch {
	case l == nil:
		since = later(since, s.raised)
		if len(s.clientRaised) > 0 {
			since = later(since, s.clientRaised[clientOf(subject)])
		}
		l = &lane{subject: subject, index: -1, since: since}
		s.lanes[subject] = l
		s.schedule(l, now)
	case l.inFlight:
		l.notified = true
	case l.expiring:
		l.expiring = false
		heap.Remove(&s.waiting, l.index)
		s.schedule(l, now)
	}
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
		if l.expiring {
			delete(s.lanes, l.subject) // its interval has passed: forgetting it is safe
			continue
		}
		l.inFlight, l.notified = true, false
		s.inFlight++
		st := s.steerOf(l.subject)
		return Job{Subject: l.subject, SendAt: l.due, HeadSeq: l.headSeq, Attempts: l.attempts, FirstAttempt: l.firstAttempt,
			PrevEnd: l.lastEnd, Since: l.since, Paused: st.Paused, PurgeThrough: st.PurgeThrough}, true
	}
	return Job{}, false
}

// Done takes a worker's Result back at now and decides when the lane is next due, or
// drops the lane when its client has nothing left.
func (s *Scheduler) Done(r Result, now time.Time) {
	l := s.lanes[r.Subject]
	if l == nil || !l.inFlight {
		return
	}
	l.inFlight = false
	s.inFlight--
	if !r.AttemptEnd.IsZero() {
		l.lastEnd = r.AttemptEnd
	}
	switch r.Kind {
	case Empty:
		switch {
		case l.notified:
			s.schedule(l, now)
		case l.lastEnd.IsZero() || !now.Before(l.lastEnd.Add(s.IntervalOf(l.subject))):
			// Nothing queued, and the last attempt is at least an interval old, so
			// forgetting the lane cannot break spacing. (A fence is not lost with it:
			// the lane is made again with the partition's fence.)
			delete(s.lanes, r.Subject)
		default:
			// Looked early (the lead): keep the lane, so that a request arriving now
			// still waits out the interval, and forget it once the interval has passed.
			l.expiring = true
			l.due = s.dueOf(l, now)
			heap.Push(&s.waiting, l)
		}
	case Delivered, DeadLettered:
		l.headSeq, l.attempts, l.firstAttempt = 0, 0, time.Time{}
		s.schedule(l, now)
	case Retry:
		l.headSeq, l.attempts, l.firstAttempt = r.Seq, r.Attempts, r.FirstAttempt
		// The interval is not added here: schedule adds it, with the interval in force.
		s.schedule(l, l.lastEnd.Add(max(s.policy.Backoff(r.Attempts, s.rand()), r.RetryAfter)))
	case Parked:
		if s.steerOf(l.subject).Paused && !l.notified {
			l.parked, l.notBefore = true, now
		} else { // resumed while the worker looked
			s.schedule(l, now)
		}
	case Failed:
		s.schedule(l, now.Add(failedRetry))
	case Held:
		// Past the lead, or Due would hand the lane straight back.
		s.schedule(l, now.Add(s.lead+heldRetry))
	}
}

// Hold puts back a lane that Due just handed out and that may not start now after all:
// its client's partition was taken over at since, so it waits out the fence like a new
// lane.
func (s *Scheduler) Hold(subject string, since time.Time) {
	l := s.lanes[subject]
	if l == nil || !l.inFlight {
		return
	}
	l.inFlight = false
	s.inFlight--
	l.since = later(l.since, since)
	s.schedule(l, l.notBefore)
}

// Forget drops a lane whether it waits or was just handed out by Due; a lane with a
// worker must be handed back with Done first.
func (s *Scheduler) Forget(subject string) {
	l := s.lanes[subject]
	if l == nil {
		return
	}
	if l.inFlight {
		s.inFlight--
	}
	if l.index >= 0 {
		heap.Remove(&s.waiting, l.index)
	}
	delete(s.lanes, subject)
}

// ForgetWaiting drops every waiting lane that match selects; lanes in flight stay.
func (s *Scheduler) ForgetWaiting(match func(subject string) bool) {
	for subj, l := range s.lanes {
		if !l.inFlight && match(subj) {
			s.Forget(subj)
		}
	}
}

// schedule puts l in the heap at notBefore, but never sooner than an interval after its
// last attempt ended or after its fence.
func (s *Scheduler) schedule(l *lane, notBefore time.Time) {
	l.notBefore = notBefore
	l.due = s.dueOf(l, notBefore)
	heap.Push(&s.waiting, l)
}

// dueOf is when l is due if nothing but spacing pushes it past notBefore, with the
// interval in force now.
func (s *Scheduler) dueOf(l *lane, notBefore time.Time) time.Time {
	iv := s.IntervalOf(l.subject)
	if l.expiring {
		return l.lastEnd.Add(iv + s.lead)
	}
	due := notBefore
	if !l.lastEnd.IsZero() {
		due = later(due, l.lastEnd.Add(iv))
	}
	if !l.since.IsZero() {
		due = later(due, l.since.Add(iv))
	}
	return due
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// laneHeap orders waiting lanes by due time.
type laneHeap []*lane

func (h laneHeap) Len() int           { return len(h) }
func (h laneHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h laneHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *laneHeap) Push(x any) {
	l := x.(*lane)
	l.index = len(*h)
	*h = append(*h, l)
}
func (h *laneHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	l.index = -1
	*h = old[:len(old)-1]
	return l
}

// Lane states, as LaneInfo.State.
const (
	LaneWaiting  = "waiting"   // due at LaneInfo.NextSend
	LaneInFlight = "in_flight" // a worker is reading or sending its head request
	LanePaused   = "paused"    // parked until the client is resumed
	LaneIdle     = "idle"      // nothing queued; kept until an interval has passed
)

// LaneInfo is what the scheduler knows of one lane, for operators.
type LaneInfo struct {
	Subject  string        `json:"subject"`
	State    string        `json:"state"`
	NextSend time.Time     `json:"next_send,omitzero"` // earliest start of its next attempt, when waiting
	Attempts int           `json:"attempts"`           // failed attempts of the head request so far
	LastEnd  time.Time     `json:"last_attempt_end,omitzero"`
	Interval time.Duration `json:"interval"`
}

// Lane describes subject's lane; false when there is none.
func (s *Scheduler) Lane(subject string) (LaneInfo, bool) {
	l := s.lanes[subject]
	if l == nil {
		return LaneInfo{}, false
	}
	return s.info(l), true
}

// LaneInfos describes up to limit lanes, in no particular order.
func (s *Scheduler) LaneInfos(limit int) []LaneInfo {
	limit = max(limit, 0)
	out := make([]LaneInfo, 0, min(limit, len(s.lanes)))
	for _, l := range s.lanes {
		if len(out) == limit {
			break
		}
		out = append(out, s.info(l))
	}
	return out
}

func (s *Scheduler) info(l *lane) LaneInfo {
	li := LaneInfo{Subject: l.subject, Attempts: l.attempts, LastEnd: l.lastEnd, Interval: s.IntervalOf(l.subject)}
	switch {
	case l.inFlight:
		li.State = LaneInFlight
	case l.parked:
		li.State = LanePaused
	case l.expiring:
		li.State = LaneIdle
	default:
		li.State, li.NextSend = LaneWaiting, l.due
	}
	return li
}
