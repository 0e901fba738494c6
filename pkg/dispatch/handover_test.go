package dispatch

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/penguinhq/dispatcher/pkg/lease"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// Unit tests of partition handover: the loop taking a partition (take), having it
// renewed, losing it and handing it back, driven step by step with the test's clock.
// Nothing runs on its own but the workers startDue starts; the test takes their results.
// Tests that start workers run in a synctest bubble: a worker's waits (its start on
// time, a retry's pause) take no time, a wait for a worker is bounded by the bubble's
// clock, which moves only once every goroutine is blocked, and the bubble ends only
// once every worker has (a gate a worker waits on is opened when the test ends).

const iv = 5 * time.Second

func newTestLoop(t testing.TB, b *bundle) *loop {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return newLoop(b.d, ctx)
}

// result waits for one worker's outcome and hands it back to the loop. In a bubble its
// 10 s pass only when no worker can finish.
func (l *loop) result(t testing.TB) finished {
	t.Helper()
	select {
	case r := <-l.results:
		l.done(r)
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no worker finished")
		return finished{}
	}
}

// A partition taken over waits out the fence: no attempt before an interval after the
// earlier owner could last have sent (notBefore), then one.
func TestAcquiredPartitionWaitsOutTheFence(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, Config{Policy: schedule.Policy{Interval: iv}})
		l := newTestLoop(t, b)
		subj := laneOf(1, "alice")
		b.src.add(subj, "r1", start)
		notBefore := start.Add(3 * time.Second) // the earlier owner's lease seen + TTL
		l.ownership(lease.Event{Kind: lease.Acquired, Partition: 1, ValidUntil: start.Add(time.Hour), NotBefore: notBefore})
		l.notify(subj)

		b.clock.advance(3*time.Second + iv - prefetchLead - time.Millisecond)
		l.startDue()
		if l.sched.InFlight() != 0 {
			t.Fatal("an attempt started before the fence (notBefore + interval)")
		}
		b.clock.advance(prefetchLead + time.Millisecond)
		l.startDue()
		if r := l.result(t); r.Kind != schedule.Delivered {
			t.Fatalf("after the fence: %+v, want Delivered", r)
		}
		if a := b.snd.attempts(); len(a) != 1 || a[0].at.Before(notBefore.Add(iv)) {
			t.Fatalf("attempts %+v, want one at or after %s", a, notBefore.Add(iv))
		}
	})
}

// Subjects of partitions this instance does not own are not scheduled.
func TestUnownedPartitionIsNotScheduled(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, Config{Policy: schedule.Policy{Interval: iv}})
		l := newTestLoop(t, b)
		l.ownership(lease.Event{Kind: lease.Acquired, Partition: 0, ValidUntil: start.Add(time.Hour)})
		l.notify(laneOf(2, "bob"))
		if _, ok := l.sched.Lane(laneOf(2, "bob")); ok {
			t.Fatal("a lane was made for a partition owned by someone else")
		}
	})
}

// A lease not renewed in time holds the lane (nothing is sent) until it is renewed.
func TestLapsingLeaseHoldsUntilRenewed(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, Config{Policy: schedule.Policy{Interval: iv}})
		l := newTestLoop(t, b)
		subj := laneOf(3, "carol")
		b.src.add(subj, "r1", start)
		l.ownership(lease.Event{Kind: lease.Acquired, Partition: 3, ValidUntil: start.Add(iv)})
		l.notify(subj)
		b.clock.advance(iv) // due now, and the lease could lapse now
		l.startDue()
		if l.sched.InFlight() != 0 || len(b.snd.attempts()) != 0 {
			t.Fatal("an attempt started although the lease could lapse")
		}
		li, ok := l.sched.Lane(subj)
		if !ok || li.State != schedule.LaneWaiting {
			t.Fatalf("lane %+v, %v: want it held, waiting", li, ok)
		}
		l.ownership(lease.Event{Kind: lease.Renewed, Partition: 3, ValidUntil: b.clock.now().Add(time.Hour)})
		b.clock.advance(time.Second)
		l.startDue()
		if r := l.result(t); r.Kind != schedule.Delivered {
			t.Fatalf("after the renewal: %+v, want Delivered", r)
		}
	})
}

// A lost lease stops new attempts at once; the attempt in flight ends, and then the
// partition and its lanes are gone. Taken again, it waits out a new fence.
func TestLostPartitionStopsAndIsFencedWhenRetaken(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, Config{Policy: schedule.Policy{Interval: iv}})
		l := newTestLoop(t, b)
		busy, other := laneOf(2, "dan"), laneOf(2, "eve")
		b.src.add(busy, "d1", start)
		b.src.add(busy, "d2", start)
		b.src.add(other, "e1", start)
		release, open := gate(t)
		b.snd.answer = func(st request.Stored, _ int) error {
			if st.ID == "d1" {
				<-release
			}
			return nil
		}
		l.ownership(lease.Event{Kind: lease.Acquired, Partition: 2, ValidUntil: start.Add(time.Hour)})
		l.notify(busy)
		b.clock.advance(iv)
		l.startDue() // d1 in flight
		waitFor(t, func() bool { return len(b.snd.attempts()) == 1 })

		l.ownership(lease.Event{Kind: lease.Lost, Partition: 2})
		l.notify(other) // arrives after the loss
		b.clock.advance(iv)
		l.startDue()
		if l.sched.InFlight() != 1 {
			t.Fatalf("%d in flight after the loss, want only the one already sent", l.sched.InFlight())
		}
		if _, ok := l.sched.Lane(other); ok {
			t.Fatal("a lane was made in a lost partition")
		}
		open()
		if r := l.result(t); r.Kind != schedule.Delivered {
			t.Fatalf("the attempt in flight: %+v, want Delivered", r)
		}
		if _, ok := l.owned[2]; ok {
			t.Fatal("the lost partition is still held after its last attempt ended")
		}
		if _, ok := l.sched.Lane(busy); ok {
			t.Fatal("the lost partition's lane outlived its attempt")
		}

		// Taken again: the fence starts over.
		retaken := b.clock.now()
		l.ownership(lease.Event{Kind: lease.Acquired, Partition: 2, ValidUntil: retaken.Add(time.Hour)})
		l.notify(busy)
		b.clock.advance(iv - prefetchLead - time.Millisecond)
		l.startDue()
		if l.sched.InFlight() != 0 {
			t.Fatal("an attempt started in a retaken partition before its fence")
		}
		b.clock.advance(prefetchLead + time.Millisecond)
		l.startDue()
		if r := l.result(t); r.Kind != schedule.Delivered || r.Lane != busy {
			t.Fatalf("after the new fence: %+v, want d2 delivered", r)
		}
	})
}

// A partition handed back is released only once its attempt in flight has ended.
func TestReleaseWaitsForTheAttemptInFlight(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, Config{Policy: schedule.Policy{Interval: iv}})
		l := newTestLoop(t, b)
		subj := laneOf(0, "fay")
		b.src.add(subj, "f1", start)
		release, open := gate(t)
		b.snd.answer = func(request.Stored, int) error { <-release; return nil }
		l.ownership(lease.Event{Kind: lease.Acquired, Partition: 0, ValidUntil: start.Add(time.Hour)})
		l.notify(subj)
		b.clock.advance(iv)
		l.startDue()
		waitFor(t, func() bool { return len(b.snd.attempts()) == 1 })

		handBack(t, l, 0, open, "released with an attempt in flight", "not released once the attempt ended")
		if _, ok := l.owned[0]; ok {
			t.Fatal("the released partition is still held")
		}

		// Handing back a partition not held answers at once.
		done2 := make(chan struct{})
		l.ownership(lease.Event{Kind: lease.Release, Partition: 3, Done: done2})
		select {
		case <-done2:
		default:
			t.Fatal("releasing a partition not held did not answer")
		}
	})
}

// waitFor checks cond once every goroutine of the test's bubble but the test's own is
// blocked: the workers started have gone as far as they can.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	synctest.Wait()
	if !cond() {
		t.Fatal("condition not met once the workers could go no further")
	}
}

// gate is a channel for workers to wait on, and the function that opens it; the test's
// end opens it too, so that no worker is left waiting on it.
func gate(t testing.TB) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(ch) }) }
	t.Cleanup(open)
	return ch, open
}

// handBack hands partition p back and checks that it is not released until the attempts
// held on release end and one result is taken back, and then is.
func handBack(t *testing.T, l *loop, p int, open func(), early, late string) {
	t.Helper()
	done := make(chan struct{})
	l.ownership(lease.Event{Kind: lease.Release, Partition: p, Done: done})
	select {
	case <-done:
		t.Fatal(early)
	default:
	}
	open()
	l.result(t)
	select {
	case <-done:
	default:
		t.Fatal(late)
	}
}
