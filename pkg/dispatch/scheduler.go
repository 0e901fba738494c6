package dispatch

import (
	"container/heap"
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
	index        int // position in the heap; -1 when not waiting
	inFlight     bool
	notified     bool // a request arrived while in flight
	expiring     bool // waiting only to be forgotten, once an interval has passed since lastEnd
	lastEnd      time.Time
	headSeq      uint64
	attempts     int
	firstAttempt time.Time
}

// Scheduler holds one lane per client with a backlog and says which may start an attempt
// when. It is not safe for concurrent use: one goroutine owns it, and passes the time in.
//
// Its one rule for spacing: a lane is never due sooner than Interval after its last
// attempt ended, whatever else (retry backoff, Retry-After, a fence) pushes it later.
type Scheduler struct {
	policy   Policy
	lead     time.Duration
	rand     func() float64
	lanes    map[string]*lane
	waiting  laneHeap
	inFlight int
}

// NewScheduler returns an empty Scheduler. rand returns numbers in [0, 1) for jitter.
func NewScheduler(p Policy, rand func() float64) *Scheduler {
	return &Scheduler{policy: p, rand: rand, lanes: make(map[string]*lane)}
}

// Lanes is how many clients the scheduler holds in memory.
func (s *Scheduler) Lanes() int { return len(s.lanes) }

// InFlight is how many lanes are with a worker.
func (s *Scheduler) InFlight() int { return s.inFlight }

// SetLead lets Due hand out lanes up to d before they are due (Job.SendAt), so that the
// worker reads the head request ahead of time. Zero (the default) hands out lanes when due.
func (s *Scheduler) SetLead(d time.Duration) { s.lead = d }

// Notify says subject has (or may have) requests queued. A new lane is due at now, or at
// notBefore if that is later; a lane already waiting or in flight is left as it is.
func (s *Scheduler) Notify(subject string, now, notBefore time.Time) {
	l := s.lanes[subject]
	switch {
	case l == nil:
		l = &lane{subject: subject, index: -1}
		s.lanes[subject] = l
		s.schedule(l, later(now, notBefore))
	case l.inFlight:
		l.notified = true
	case l.expiring:
		l.expiring = false
		heap.Remove(&s.waiting, l.index)
		s.schedule(l, later(now, notBefore))
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
		return Job{Subject: l.subject, SendAt: l.due, HeadSeq: l.headSeq, Attempts: l.attempts, FirstAttempt: l.firstAttempt, PrevEnd: l.lastEnd}, true
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
		case l.lastEnd.IsZero() || !now.Before(l.lastEnd.Add(s.policy.Interval)):
			// Nothing queued, and the last attempt is at least an interval old, so
			// forgetting the lane cannot break spacing.
			delete(s.lanes, r.Subject)
		default:
			// Looked early (the lead): keep the lane, so that a request arriving now
			// still waits out the interval, and forget it once the interval has passed.
			l.expiring = true
			l.due = l.lastEnd.Add(s.policy.Interval + s.lead)
			heap.Push(&s.waiting, l)
		}
	case Delivered, DeadLettered:
		l.headSeq, l.attempts, l.firstAttempt = 0, 0, time.Time{}
		s.schedule(l, now)
	case Retry:
		l.headSeq, l.attempts, l.firstAttempt = r.Seq, r.Attempts, r.FirstAttempt
		s.schedule(l, l.lastEnd.Add(s.policy.RetryDelay(r.Attempts, r.RetryAfter, s.rand())))
	case Failed:
		s.schedule(l, now.Add(failedRetry))
	case Held:
		// Past the lead, or Due would hand the lane straight back.
		s.schedule(l, now.Add(s.lead+heldRetry))
	}
}

// Hold puts back a lane that Due just handed out and that may not start now after all,
// due again at until (or later, if spacing says so).
func (s *Scheduler) Hold(subject string, until time.Time) {
	l := s.lanes[subject]
	if l == nil || !l.inFlight {
		return
	}
	l.inFlight = false
	s.inFlight--
	s.schedule(l, until)
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

// schedule puts l in the heap at due, but never sooner than an interval after its last
// attempt ended.
func (s *Scheduler) schedule(l *lane, due time.Time) {
	if !l.lastEnd.IsZero() {
		due = later(due, l.lastEnd.Add(s.policy.Interval))
	}
	l.due = due
	heap.Push(&s.waiting, l)
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
