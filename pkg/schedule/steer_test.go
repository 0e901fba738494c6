package schedule_test

import (
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// deliver takes client's due job at now and reports it delivered, the attempt ending at
// once; it returns the job.
func deliver(t testing.TB, s *schedule.Scheduler, now time.Time, client string) schedule.Job {
	t.Helper()
	job := mustDue(t, s, now, client)
	s.Done(schedule.Result{Lane: ln(client), Kind: schedule.Delivered, AttemptEnd: now}, now)
	return job
}

func TestGlobalIntervalChangeMovesWaitingLanes(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Notify(ln("a"), t0, time.Time{})
	deliver(t, s, t0, "a")

	s.SetInterval(20*time.Second, t0) // longer: the waiting lane is pushed back
	mustNotDue(t, s, t0.Add(20*time.Second-time.Nanosecond))
	deliver(t, s, t0.Add(20*time.Second), "a")

	s.SetInterval(2*time.Second, t0) // shorter: brought forward
	mustNotDue(t, s, t0.Add(22*time.Second-time.Nanosecond))
	mustDue(t, s, t0.Add(22*time.Second), "a")
}

func TestClientIntervalOverridesGlobal(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Steer("slow", request.Steering{Interval: request.Duration(time.Minute)}, t0.Add(-time.Hour))
	for _, c := range []string{"slow", "fast"} {
		s.Notify(ln(c), t0, time.Time{})
		deliver(t, s, t0, c)
	}
	mustDue(t, s, t0.Add(interval), "fast")
	mustNotDue(t, s, t0.Add(time.Minute-time.Nanosecond))
	mustDue(t, s, t0.Add(time.Minute), "slow")
	if got := s.IntervalOf(ln("slow")); got != time.Minute {
		t.Fatalf("IntervalOf(slow) = %s, want 1m", got)
	}

	// Clearing the steer brings the client back to the global interval.
	s2 := schedule.New(policy(), zero)
	s2.Steer("slow", request.Steering{Interval: request.Duration(time.Minute)}, t0.Add(-time.Hour))
	s2.Notify(ln("slow"), t0, time.Time{})
	deliver(t, s2, t0, "slow")
	s2.Steer("slow", request.Steering{}, t0)
	mustDue(t, s2, t0.Add(interval), "slow")
}

// Steering names a client by its token: it reaches the client's lane whatever its
// partition (a client moves partition when the partition count changes), and no other
// client's lane in that partition.
func TestSteeringReachesTheClientInAnyPartition(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Steer("slow", request.Steering{Interval: request.Duration(time.Minute)}, t0.Add(-time.Hour))
	lanes := []request.Lane{{Partition: 3, Token: "slow"}, {Partition: 40, Token: "slow"}, {Partition: 3, Token: "fast"}}
	for _, l := range lanes {
		s.Notify(l, t0, time.Time{})
	}
	for range lanes {
		job, ok := s.Due(t0)
		if !ok {
			t.Fatal("a new lane was not due at once")
		}
		s.Done(schedule.Result{Lane: job.Lane, Kind: schedule.Delivered, AttemptEnd: t0}, t0)
	}
	for _, l := range lanes {
		want := interval
		if l.Token == "slow" {
			want = time.Minute
		}
		if got := s.IntervalOf(l); got != want {
			t.Errorf("IntervalOf(%+v) = %s, want %s", l, got, want)
		}
	}
	job, ok := s.Due(t0.Add(interval))
	if !ok || job.Lane != lanes[2] {
		t.Fatalf("due one interval on: %+v %v, want the fast client's lane alone", job, ok)
	}
	if job, ok := s.Due(t0.Add(time.Minute - time.Nanosecond)); ok {
		t.Fatalf("%+v due before the slow client's minute", job)
	}
}

func TestFenceUsesTheClientsInterval(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Steer("slow", request.Steering{Interval: request.Duration(time.Minute)}, t0.Add(-time.Hour))
	s.Notify(ln("slow"), t0, t0) // taken over at t0: the previous owner may have just sent
	mustNotDue(t, s, t0.Add(time.Minute-time.Nanosecond))
	mustDue(t, s, t0.Add(time.Minute), "slow")
}

func TestPausedLaneParksAndResumesSpaced(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Notify(ln("a"), t0, time.Time{})
	deliver(t, s, t0, "a")
	s.Steer("a", request.Steering{Paused: true}, t0)

	job := mustDue(t, s, t0.Add(interval), "a")
	if !job.Paused {
		t.Fatal("job of a paused client is not marked paused")
	}
	s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.Parked}, t0.Add(interval))
	s.Notify(ln("a"), t0.Add(interval), time.Time{}) // more requests arrive: still parked
	mustNotDue(t, s, t0.Add(time.Hour))
	if li, ok := s.Lane(ln("a")); !ok || li.State != schedule.LanePaused {
		t.Fatalf("lane = %+v, %v; want paused", li, ok)
	}

	s.Steer("a", request.Steering{}, t0) // resume: due at once (the interval has long passed)
	job = mustDue(t, s, t0.Add(time.Hour), "a")
	if job.Paused {
		t.Fatal("job after resume is still marked paused")
	}
}

func TestResumeSoonAfterASendStillWaitsTheInterval(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Notify(ln("a"), t0, time.Time{})
	deliver(t, s, t0, "a")
	s.Steer("a", request.Steering{Paused: true}, t0)
	s.Steer("a", request.Steering{}, t0.Add(time.Second)) // resumed before the interval passed
	mustNotDue(t, s, t0.Add(interval-time.Nanosecond))
	mustDue(t, s, t0.Add(interval), "a")
}

// A purge asked for while a client is paused and its lane parked has the lane looked at
// again, still marked paused; nothing was sent, so spacing counts from the last send.
func TestPurgeOfAParkedLaneLooksAgain(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Notify(ln("a"), t0, time.Time{})
	deliver(t, s, t0, "a")
	s.Steer("a", request.Steering{Paused: true}, t0)
	job := mustDue(t, s, t0.Add(interval), "a")
	s.Done(schedule.Result{Lane: job.Lane, Kind: schedule.Parked}, t0.Add(interval))
	// The purge asks for a look; nothing was sent meanwhile, so spacing still counts
	// from t0.
	s.Steer("a", request.Steering{Paused: true, PurgeThrough: 9}, t0)
	job = mustDue(t, s, t0.Add(interval), "a")
	if !job.Paused || job.PurgeThrough != 9 {
		t.Fatalf("job = %+v, want paused with purge through 9", job)
	}
}

func TestPurgeLeavesSpacingFromTheLastRealAttempt(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Notify(ln("a"), t0, time.Time{})
	deliver(t, s, t0, "a")
	s.Steer("a", request.Steering{PurgeThrough: 5}, t0)
	now := t0.Add(interval)
	job := mustDue(t, s, now, "a")
	if job.PurgeThrough != 5 {
		t.Fatalf("job.PurgeThrough = %d, want 5", job.PurgeThrough)
	}
	// A purged request is no attempt: the lane is due again at once.
	s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.DeadLettered}, now)
	mustDue(t, s, now, "a")
}

// A client whose lane was forgotten (its interval had passed) may have sent as late as
// one old interval ago: after a raise, its next request waits the new interval from then.
func TestRaisedIntervalFencesClientsWithoutALane(t *testing.T) {
	t.Parallel()
	for _, raise := range []func(s *schedule.Scheduler, now time.Time){
		func(s *schedule.Scheduler, now time.Time) { s.SetInterval(time.Minute, now) },
		func(s *schedule.Scheduler, now time.Time) {
			s.Steer("a", request.Steering{Interval: request.Duration(time.Minute)}, now)
		},
	} {
		s := schedule.New(policy(), zero)
		s.Notify(ln("a"), t0, time.Time{})
		deliver(t, s, t0, "a")
		forgetAt := t0.Add(interval)
		mustDue(t, s, forgetAt, "a")
		s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.Empty}, forgetAt)
		if s.Lanes() != 0 {
			t.Fatal("the drained lane was kept; the test needs it forgotten")
		}
		raiseAt := forgetAt.Add(time.Second)
		raise(s, raiseAt)
		s.Notify(ln("a"), raiseAt, time.Time{})
		// The last attempt ended at t0; the scheduler only knows it was at least 5s
		// before the raise, so it waits a minute from raiseAt-5s.
		mustNotDue(t, s, raiseAt.Add(time.Minute-interval-time.Nanosecond))
		mustDue(t, s, raiseAt.Add(time.Minute-interval), "a")
	}
}

// A purge asked for while a paused client's lane is with a worker is not lost when the
// worker reports the lane parked.
func TestPurgeWhileAPausedLaneIsInFlight(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Steer("a", request.Steering{Paused: true}, t0.Add(-time.Hour))
	s.Notify(ln("a"), t0, time.Time{})
	job := mustDue(t, s, t0, "a")
	if !job.Paused || job.PurgeThrough != 0 {
		t.Fatalf("job %+v", job)
	}
	s.Steer("a", request.Steering{Paused: true, PurgeThrough: 7}, t0) // while in flight
	s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.Parked}, t0)
	job = mustDue(t, s, t0, "a")
	if job.PurgeThrough != 7 {
		t.Fatalf("after the purge was asked for, job %+v, want purge through 7", job)
	}
}

func TestLaneInfosWithANonsenseLimit(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Notify(ln("a"), t0, time.Time{})
	if got := s.LaneInfos(-1); len(got) != 0 {
		t.Fatalf("LaneInfos(-1) = %v", got)
	}
	if got := s.LaneInfos(5); len(got) != 1 || got[0].State != schedule.LaneWaiting {
		t.Fatalf("LaneInfos(5) = %v", got)
	}
}

// A purge reaches a lane whose head waits for its Not-Before: the lane is handed out as
// soon as spacing allows, to dead-letter what was purged, not at the head's time.
func TestPurgeDoesNotWaitForADelayedHead(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Notify(ln("a"), t0, time.Time{})
	mustDue(t, s, t0, "a")
	s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.NotYet, Seq: 7, NotBefore: t0.Add(time.Hour)}, t0)
	mustNotDue(t, s, t0.Add(time.Minute))

	s.Steer("a", request.Steering{PurgeThrough: 7}, t0.Add(time.Minute))
	if job := mustDue(t, s, t0.Add(time.Minute), "a"); job.PurgeThrough != 7 {
		t.Fatalf("job %+v, want it to purge through 7", job)
	}
}

// A purge that does not reach a delayed head leaves it waiting for its time.
func TestPurgeShortOfADelayedHeadLeavesItWaiting(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Notify(ln("a"), t0, time.Time{})
	mustDue(t, s, t0, "a")
	s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.NotYet, Seq: 9, NotBefore: t0.Add(time.Hour)}, t0)
	s.Steer("a", request.Steering{PurgeThrough: 7}, t0.Add(time.Minute))
	mustNotDue(t, s, t0.Add(time.Hour-time.Nanosecond))
	mustDue(t, s, t0.Add(time.Hour), "a")
}

// A purge asked for while the lane is with a worker that finds a delayed head, or whose
// attempt fails, is not put off until the head's time or the retry's backoff: the lane
// comes back as soon as spacing allows, to dead-letter what was purged.
func TestPurgeWhileTheLaneIsInFlightDoesNotWait(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		res   schedule.Result
		purge time.Time // when the purge's job is due: an interval after the attempt, if any
	}{
		{"DelayedHead", schedule.Result{Kind: schedule.NotYet, Seq: 7, NotBefore: t0.Add(48 * time.Hour)}, t0},
		{"FailingAttempt", schedule.Result{Kind: schedule.Retry, Seq: 7, Attempts: 9, FirstAttempt: t0, AttemptEnd: t0,
			RetryAfter: 5 * time.Minute}, t0.Add(interval)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := schedule.New(policy(), zero)
			s.Notify(ln("a"), t0, time.Time{})
			mustDue(t, s, t0, "a")
			s.Steer("a", request.Steering{PurgeThrough: 7}, t0) // while the worker has the lane
			tc.res.Lane = ln("a")
			s.Done(tc.res, t0)
			if tc.purge.After(t0) { // spacing still holds: no sooner than the interval after the attempt
				mustNotDue(t, s, tc.purge.Add(-time.Nanosecond))
			}
			if job := mustDue(t, s, tc.purge, "a"); job.PurgeThrough != 7 {
				t.Fatalf("job %+v, want it to purge through 7", job)
			}
		})
	}
}

// A purge that does not reach the head a worker reports back leaves its wait as it is.
func TestPurgeShortOfTheHeadInFlightLeavesItsWait(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	s.Notify(ln("a"), t0, time.Time{})
	mustDue(t, s, t0, "a")
	s.Steer("a", request.Steering{PurgeThrough: 6}, t0)
	s.Done(schedule.Result{Lane: ln("a"), Kind: schedule.NotYet, Seq: 7, NotBefore: t0.Add(time.Hour)}, t0)
	mustNotDue(t, s, t0.Add(time.Hour-time.Nanosecond))
	mustDue(t, s, t0.Add(time.Hour), "a")
}

// An interval longer than request.MaxInterval found in the control bucket (written by
// another tool: the admin API and the settings refuse one) is held to MaxInterval: with
// 1,000,000 h, three intervals overflowed, and a lane not due for years counted as
// overdue (the DispatchLanesOverdue alert fired). The global one alike.
func TestAnIntervalPastTheLongestIsHeldToIt(t *testing.T) {
	t.Parallel()
	s := schedule.New(policy(), zero)
	huge := 1_000_000 * time.Hour
	s.Steer("far", request.Steering{Interval: request.Duration(huge)}, t0.Add(-time.Hour))
	if got := s.IntervalOf(ln("far")); got != request.MaxInterval {
		t.Fatalf("interval in force %s, want MaxInterval %s", got, request.MaxInterval)
	}
	s.Notify(ln("far"), t0, t0) // just sent: due after its interval
	if n := s.Overdue(t0.Add(time.Hour)); n != 0 {
		t.Fatalf("%d lanes overdue an hour after a send at a 1,000,000 h interval, want 0", n)
	}
	if next, ok := s.Next(); !ok || next.Before(t0.Add(request.MaxInterval)) || next.After(t0.Add(request.MaxInterval+time.Minute)) {
		t.Fatalf("next send %v (%v), want a week after the last", next.Sub(t0), ok)
	}
	g := schedule.New(policy(), zero)
	g.SetInterval(huge, t0)
	if got := g.IntervalOf(ln("any")); got != request.MaxInterval {
		t.Fatalf("global interval in force %s, want MaxInterval %s", got, request.MaxInterval)
	}
}
