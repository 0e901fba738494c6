package schedule_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const interval = 5 * time.Second

func policy() schedule.Policy {
	return schedule.Policy{Interval: interval, BackoffBase: time.Second, BackoffMax: time.Minute, Jitter: 0.2, MaxAttempts: 5, MaxAge: time.Hour}.WithDefaults()
}

func zero() float64 { return 0 }

// mustDue takes the one job due at now and fails if there is none or another.
// ln is the lane of client token name (partition 0).
func ln(name string) request.Lane { return request.Lane{Token: name} }

func mustDue(t testing.TB, s *schedule.Scheduler, now time.Time, client string) schedule.Job {
	t.Helper()
	job, ok := s.Due(now)
	if !ok {
		next, _ := s.Next()
		t.Fatalf("nothing due at %s (next at %s)", now.Sub(t0), next.Sub(t0))
	}
	if job.Lane != ln(client) {
		t.Fatalf("due at %s: %s, want %s", now.Sub(t0), job.Lane.Token, client)
	}
	return job
}

func mustNotDue(t testing.TB, s *schedule.Scheduler, now time.Time) {
	t.Helper()
	if job, ok := s.Due(now); ok {
		t.Fatalf("%s due at %s, want nothing", job.Lane.Token, now.Sub(t0))
	}
}

func TestIdleClientGoesAtOnce(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Notify(ln("a"), t0, time.Time{})
	mustDue(t, s, t0, "a")
}

func TestSpacingIsMeasuredFromAttemptEnd(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Notify(ln("a"), t0, time.Time{})
	mustDue(t, s, t0, "a")
	end := t0.Add(700 * time.Millisecond) // raven took 700ms
	s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.Delivered, AttemptEnd: end}, end.Add(time.Millisecond))
	next, _ := s.Next()
	if want := end.Add(interval); !next.Equal(want) {
		t.Fatalf("next due %s after t0, want exactly %s", next.Sub(t0), want.Sub(t0))
	}
	mustNotDue(t, s, end.Add(interval-time.Nanosecond))
	job := mustDue(t, s, end.Add(interval), "a")
	if !job.PrevEnd.Equal(end) {
		t.Fatalf("job.PrevEnd = %s, want %s", job.PrevEnd, end)
	}
}

func TestAtMostOneInFlightPerClient(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Notify(ln("a"), t0, time.Time{})
	mustDue(t, s, t0, "a")
	for range 3 {
		s.Notify(ln("a"), t0, time.Time{}) // more requests arrive while one is in flight
	}
	mustNotDue(t, s, t0.Add(time.Hour))
	if s.InFlight() != 1 || s.Lanes() != 1 {
		t.Fatalf("in flight %d, lanes %d; want 1 and 1", s.InFlight(), s.Lanes())
	}
	// The request that arrived in flight is looked at after the interval even if the
	// worker found the head empty at the time it looked.
	s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.Empty}, t0.Add(time.Millisecond))
	mustDue(t, s, t0.Add(time.Millisecond), "a")
}

func TestManyClientsAreIndependent(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Notify(ln("busy"), t0, time.Time{})
	mustDue(t, s, t0, "busy")
	s.Done(schedule.Result{Lane: ln("busy"), Kind: schedule.Delivered, AttemptEnd: t0}, t0)
	s.Notify(ln("idle"), t0.Add(time.Second), time.Time{})
	mustDue(t, s, t0.Add(time.Second), "idle")
	mustNotDue(t, s, t0.Add(time.Second))
	mustDue(t, s, t0.Add(interval), "busy")
}

func TestEmptyLaneIsDropped(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Notify(ln("a"), t0, time.Time{})
	mustDue(t, s, t0, "a")
	s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.Delivered, AttemptEnd: t0}, t0)
	mustDue(t, s, t0.Add(interval), "a")
	s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.Empty}, t0.Add(interval))
	if s.Lanes() != 0 {
		t.Fatalf("lanes = %d after the client drained, want 0", s.Lanes())
	}
	if _, ok := s.Next(); ok {
		t.Fatal("a dropped lane is still scheduled")
	}
}

func TestFenceHoldsNewLanes(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Notify(ln("a"), t0, t0) // the partition was taken over at t0
	fence := t0.Add(interval)
	mustNotDue(t, s, fence.Add(-time.Nanosecond))
	mustDue(t, s, fence, "a")
}

func TestBackoffDoublesToCapAndNeverUndercutsInterval(t *testing.T) {
	t.Parallel()
	p := policy() // base 1s, max 1m, interval 5s
	s := schedule.New(p, zero)
	s.Notify(ln("a"), t0, time.Time{})
	now := t0
	want := []time.Duration{5 * time.Second, 5 * time.Second, 5 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, time.Minute, time.Minute}
	for i, w := range want {
		job := mustDue(t, s, now, "a")
		attempt := job.Attempts + 1
		if attempt != i+1 {
			t.Fatalf("attempt %d, want %d", attempt, i+1)
		}
		end := now.Add(100 * time.Millisecond)
		s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.Retry, Seq: 7, Attempts: attempt, AttemptEnd: end}, end)
		next, _ := s.Next()
		if got := next.Sub(end); got != w {
			t.Fatalf("after failure %d: next attempt %s after the end, want %s", attempt, got, w)
		}
		now = next
	}
}

func TestRetryAfterIsHonoured(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Notify(ln("a"), t0, time.Time{})
	mustDue(t, s, t0, "a")
	s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.Retry, Seq: 1, Attempts: 1, AttemptEnd: t0, RetryAfter: 42 * time.Second}, t0)
	mustNotDue(t, s, t0.Add(42*time.Second-time.Nanosecond))
	mustDue(t, s, t0.Add(42*time.Second), "a")

	// A Retry-After shorter than the interval does not shorten it.
	s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.Retry, Seq: 1, Attempts: 2, AttemptEnd: t0.Add(42 * time.Second), RetryAfter: time.Second}, t0.Add(42*time.Second))
	mustNotDue(t, s, t0.Add(42*time.Second+interval-time.Nanosecond))
}

func TestJitterBounds(t *testing.T) {
	t.Parallel()
	p := policy()
	r := rand.New(rand.NewPCG(1, 2))
	for attempt := 1; attempt <= 10; attempt++ {
		full := p.Backoff(attempt, 0)
		lo := time.Duration(float64(full) * (1 - p.Jitter))
		seenLow, seenHigh := false, false
		for range 1000 {
			x := r.Float64()
			b := p.Backoff(attempt, x)
			if b < lo || b > full {
				t.Fatalf("attempt %d: backoff %s outside [%s, %s] for rnd %v", attempt, b, lo, full, x)
			}
			seenLow = seenLow || b < lo+(full-lo)/4
			seenHigh = seenHigh || b > full-(full-lo)/4
		}
		if !seenLow || !seenHigh {
			t.Fatalf("attempt %d: jitter does not spread over its range", attempt)
		}
	}
}

func TestRetryStateFollowsTheHead(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Notify(ln("a"), t0, time.Time{})
	mustDue(t, s, t0, "a")
	s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.Retry, Seq: 9, Attempts: 1, FirstAttempt: t0, AttemptEnd: t0}, t0)
	job := mustDue(t, s, t0.Add(interval), "a")
	if job.HeadSeq != 9 || job.Attempts != 1 || !job.FirstAttempt.Equal(t0) {
		t.Fatalf("job after a retry = %+v, want head 9 with 1 attempt", job)
	}
	s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.DeadLettered, AttemptEnd: t0.Add(interval)}, t0.Add(interval))
	job = mustDue(t, s, t0.Add(2*interval), "a")
	if job.Attempts != 0 || job.HeadSeq != 0 {
		t.Fatalf("job after a dead letter = %+v, want a fresh head", job)
	}
}

func TestFailedReadIsRetriedButKeepsSpacing(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Notify(ln("a"), t0, time.Time{})
	mustDue(t, s, t0, "a")
	s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.Delivered, AttemptEnd: t0}, t0)
	mustDue(t, s, t0.Add(interval), "a")
	s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.Failed}, t0.Add(interval))
	mustNotDue(t, s, t0.Add(interval+time.Second-time.Nanosecond))
	mustDue(t, s, t0.Add(interval+time.Second), "a")
}

func TestGiveUp(t *testing.T) {
	t.Parallel()
	p := policy() // 5 attempts, 1h
	cases := []struct {
		name    string
		attempt int
		age     time.Duration
		wantWhy request.Reason
	}{
		{"Retry", 1, time.Minute, ""},
		{"AttemptsExhausted", 5, time.Minute, "attempts_exhausted"},
		{"AgeExhausted", 2, time.Hour, "age_exhausted"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := p.GiveUp(c.attempt, t0, t0.Add(c.age)); got != c.wantWhy {
				t.Fatalf("GiveUp = %q, want %q", got, c.wantWhy)
			}
		})
	}
}

func TestPolicyValidate(t *testing.T) {
	t.Parallel()
	if err := policy().Validate(); err != nil {
		t.Fatal(err)
	}
	bad := policy()
	bad.Interval = -time.Second
	bad.Jitter = 1
	if err := bad.Validate(); err == nil {
		t.Fatal("a negative interval and jitter 1 validate")
	}
}

func TestLeadHandsOutEarlyButSendAtIsExact(t *testing.T) {
	t.Parallel()
	const lead = 50 * time.Millisecond
	s := schedule.New(policy(), zero)
	s.SetLead(lead)
	s.Notify(ln("a"), t0, time.Time{})
	mustDue(t, s, t0, "a")
	end := t0.Add(10 * time.Millisecond)
	s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.Delivered, AttemptEnd: end}, end)
	if next, _ := s.Next(); !next.Equal(end.Add(interval - lead)) {
		t.Fatalf("Next = %s, want the lead before the due time", next.Sub(t0))
	}
	mustNotDue(t, s, end.Add(interval-lead-time.Nanosecond))
	job := mustDue(t, s, end.Add(interval-lead), "a")
	if !job.SendAt.Equal(end.Add(interval)) {
		t.Fatalf("SendAt %s, want exactly the interval after the last attempt ended (%s)", job.SendAt.Sub(t0), end.Add(interval).Sub(t0))
	}
}

// A lane looked at early (the lead) and found empty must not be forgotten before its
// interval has passed: a request arriving in between would otherwise go at once.
func TestEarlyEmptyLaneKeepsSpacing(t *testing.T) {
	t.Parallel()
	const lead = 50 * time.Millisecond
	s := schedule.New(policy(), zero)
	s.SetLead(lead)
	s.Notify(ln("a"), t0, time.Time{})
	mustDue(t, s, t0, "a")
	s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.Delivered, AttemptEnd: t0}, t0)
	early := t0.Add(interval - lead)
	mustDue(t, s, early, "a")
	s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.Empty}, early.Add(time.Millisecond))
	if s.Lanes() != 1 {
		t.Fatalf("lanes %d: the lane was forgotten before its interval passed", s.Lanes())
	}
	s.Notify(ln("a"), early.Add(2*time.Millisecond), time.Time{}) // a request arrives
	job := mustDue(t, s, early.Add(2*time.Millisecond), "a")
	if job.SendAt.Before(t0.Add(interval)) {
		t.Fatalf("SendAt %s, before the interval after the last attempt", job.SendAt.Sub(t0))
	}
	// Without a new request the lane is forgotten once the interval has passed.
	s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.Empty}, early.Add(3*time.Millisecond))
	mustNotDue(t, s, t0.Add(interval+lead))
	if s.Lanes() != 0 {
		t.Fatalf("lanes %d after the interval passed, want 0", s.Lanes())
	}
}

// A lane held back because its partition's lease is awaiting renewal is looked at again
// after the lead, not handed straight back (which would spin reading the head).
func TestHeldLaneIsNotHandedStraightBack(t *testing.T) {
	t.Parallel()
	const lead = 50 * time.Millisecond
	s := schedule.New(policy(), zero)
	s.SetLead(lead)
	s.Notify(ln("a"), t0, time.Time{})
	mustDue(t, s, t0, "a")
	s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.Held}, t0)
	mustNotDue(t, s, t0)
	mustDue(t, s, t0.Add(50*time.Millisecond), "a")
}

func TestDueLanesListsTheEarliestFirst(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	order := rand.Perm(200)
	for _, k := range order {
		// The fence makes each lane due at its own time: k seconds after an interval.
		s.Notify(ln(fmt.Sprintf("c%03d", k)), t0, t0.Add(time.Duration(k)*time.Second))
	}
	got := s.DueLanes(25)
	if len(got) != 25 {
		t.Fatalf("%d lanes, want 25", len(got))
	}
	for i, l := range got {
		if want := fmt.Sprintf("c%03d", i); l.Lane != ln(want) || l.State != schedule.LaneWaiting {
			t.Fatalf("lane %d: %s (%s), want %s waiting", i, l.Lane.Token, l.State, want)
		}
	}
	if n := len(s.DueLanes(1000)); n != 200 {
		t.Fatalf("%d lanes with a limit above their number, want all 200", n)
	}
}

// A lane handed back as held at every look (its partition's lease lapsed, say) counts
// as overdue once it has been due for OverdueAfter intervals, although each look moves
// its due time on; one attempt made ends that. A lane waiting for its interval or a
// backoff is not overdue.
func TestOverdueCountsLanesHeldBackAtEveryLook(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Notify(ln("held"), t0, time.Time{})
	s.Notify(ln("fine"), t0, time.Time{})
	now := t0
	for now.Before(t0.Add(schedule.OverdueAfter*interval + time.Second)) {
		for {
			job, ok := s.Due(now)
			if !ok {
				break
			}
			r := schedule.Result{Lane: job.Lane, Kind: schedule.Held}
			if job.Lane.Token == "fine" { // an attempt was made and failed: it waits its backoff
				r = schedule.Result{Lane: job.Lane, Kind: schedule.Retry, AttemptEnd: now, Attempts: 1}
			}
			s.Done(r, now)
		}
		if n := s.Overdue(now); now.Sub(t0) <= schedule.OverdueAfter*interval && n != 0 {
			t.Fatalf("%d overdue at %s, want none yet", n, now.Sub(t0))
		}
		now = now.Add(100 * time.Millisecond)
	}
	if n := s.Overdue(now); n != 1 {
		t.Fatalf("%d lanes overdue after %s of looks held back, want 1 (held)", n, now.Sub(t0))
	}
	job := mustDue(t, s, now.Add(time.Second), "held")
	s.Done(schedule.Result{Lane: job.Lane, Kind: schedule.Delivered, AttemptEnd: now.Add(time.Second)}, now.Add(time.Second))
	if n := s.Overdue(now.Add(time.Second)); n != 0 {
		t.Fatalf("%d overdue after held's attempt, want 0", n)
	}
}
