package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Directed tests of the fences the simulation (pkg/dispatch/dispatchsim) found broken:
// each drives the leaser's view of the lease watch by hand, and fails on the code before
// its fix. The simulation's TestSimulationFindings keeps the seeds that found them.

// watchOnly is a lease store whose watch starts and delivers nothing by itself: the
// test hands the leaser its events.
type watchOnly struct {
	LeaseStore
	written bool
}

func (watchOnly) WatchLeases(context.Context, func(request.LeaseChange), func(error)) (func(), error) {
	return func() {}, nil
}

func (w watchOnly) Written(context.Context) (bool, error) { return w.written, nil }

const testTTL = 10 * time.Second

func watchingLeaser(t *testing.T, store LeaseStore, fresh bool) (*leaser, *bundle) {
	t.Helper()
	b := setup(t, Config{Leases: store, LeaseTTL: testTTL, SendTimeout: time.Second})
	m := newLeaser(b.d, make(chan ownEvent, 16))
	m.fresh = fresh
	m.watch(context.Background(), func() {})
	return m, b
}

// A holds p3 and renews it; the store's clock removes A's lease unseen; B takes p3 and
// hands it back; C takes it. A may send until a TTL after its renewal: C must not start
// before then. (The release used to forget every renewal of p3, A's with B's.)
func TestAReleaseKeepsAnEarlierHoldersFence(t *testing.T) {
	t.Parallel()
	m, b := watchingLeaser(t, watchOnly{written: true}, false)
	b.clock.advance(2 * testTTL) // the watch has run for longer than a TTL: nothing unseen
	renewed := b.clock.now()
	m.saw(request.LeaseChange{Partition: 3, Owner: "a", Released: false, Rev: 10})
	b.clock.advance(2 * time.Second)
	m.saw(request.LeaseChange{Partition: 3, Owner: "b", Released: false, Rev: 11}) // b takes p3 after a's lease vanished
	b.clock.advance(time.Second)
	m.saw(request.LeaseChange{Partition: 3, Owner: "", Released: true, Rev: 12}) // and hands it back
	if nb := m.notBefore(3, true); nb.Before(renewed.Add(testTTL)) {
		t.Fatalf("after b's release, c may start at %s; a renewed at %s and may send until %s",
			nb.Sub(start), renewed.Sub(start), renewed.Add(testTTL).Sub(start))
	}
}

// An instance whose watch began less than a TTL ago saw no renewal made before: a
// partition it takes waits until a TTL after the watch began (the README's rule; it used
// to wait only when the watch restarted, not at start), unless the store was never
// written to, or the watch saw the partition handed back.
func TestAFreshInstanceWaitsForRenewalsItCouldNotSee(t *testing.T) {
	t.Parallel()
	m, b := watchingLeaser(t, watchOnly{written: true}, false)
	began := b.clock.now()
	b.clock.advance(time.Second)
	if nb := m.notBefore(5, true); nb.Before(began.Add(testTTL)) {
		t.Fatalf("a partition taken a second after the watch began may start at %s, want a TTL after the watch began (%s)",
			nb.Sub(start), began.Add(testTTL).Sub(start))
	}
	m.saw(request.LeaseChange{Partition: 6, Owner: "a", Released: false, Rev: 3})
	m.saw(request.LeaseChange{Partition: 6, Owner: "", Released: true, Rev: 4}) // a handed p6 back: a holder does so only once its own fence passed
	if nb := m.notBefore(6, true); !nb.IsZero() {
		t.Fatalf("p6, seen handed back after the watch began, waits until %s; nobody can be sending there", nb.Sub(start))
	}
	fresh, _ := watchingLeaser(t, watchOnly{}, true)
	if nb := fresh.notBefore(5, true); !nb.IsZero() {
		t.Fatalf("in a store never written to, a partition waits until %s; nobody can have renewed it unseen", nb.Sub(start))
	}
}

// eventDeadline records the deadline WriteNow was given.
type eventDeadline struct{ left time.Duration }

func (e *eventDeadline) Record(request.Event) {}
func (e *eventDeadline) WriteNow(ctx context.Context, _ request.Event) bool {
	d, _ := ctx.Deadline()
	e.left = time.Until(d)
	return true
}

// The wait for a delivered request's final event ends by the attempt's own deadline
// (sendBy + the send timeout): the removal that follows must land while the lease still
// holds, or the next owner sends the request again. It used to wait 2 s whatever the
// lease said.
func TestTheFinalEventsWaitEndsInsideTheLease(t *testing.T) {
	t.Parallel()
	ev := &eventDeadline{}
	b := setup(t, Config{Leases: watchOnly{written: true}, LeaseTTL: testTTL, SendTimeout: time.Second, Events: ev})
	sendBy := b.clock.now().Add(100 * time.Millisecond) // the attempt started near the end of the lease's window
	b.d.writeNow(context.Background(), request.Event{Type: request.EventDelivered}, sendBy)
	if ev.left > 1100*time.Millisecond+100*time.Millisecond {
		t.Fatalf("the final event may be waited for %s; the attempt's deadline is 1.1 s away (sendBy + send timeout)", ev.left)
	}
	b.d.writeNow(context.Background(), request.Event{Type: request.EventDelivered}, time.Time{})
	if ev.left < time.Second {
		t.Fatalf("without a lease the final event is waited for %s, want the 2 s of eventWait", ev.left)
	}
}

// releases records what a graceful stop hands back.
type releases struct {
	watchOnly
	released []int
	all      bool
}

func (r *releases) Leave(context.Context, string) error { return nil }
func (r *releases) Release(_ context.Context, p int, _ uint64) error {
	r.released = append(r.released, p)
	return nil
}
func (r *releases) ReleaseAll(context.Context, string) (int, error) { r.all = true; return 0, nil }

// A graceful stop hands back a lease only once its fence has passed: a release tells a
// newcomer that every earlier holder has stopped, and one inside its fence (an earlier
// holder may still send there) is left to expire instead.
func TestAStopReleasesNoLeaseInsideItsFence(t *testing.T) {
	t.Parallel()
	store := &releases{watchOnly: watchOnly{written: true}}
	m, b := watchingLeaser(t, store, false)
	now := b.clock.now()
	m.held[1] = &holding{rev: 1, fence: now.Add(-time.Second)} // past its fence
	m.held[2] = &holding{rev: 2, fence: now.Add(time.Second)}  // an earlier holder may still send
	m.releaseAll(context.Background())
	if store.all || len(store.released) != 1 || store.released[0] != 1 {
		t.Fatalf("released %v (all: %v), want partition 1 alone", store.released, store.all)
	}
	if len(m.held) != 0 {
		t.Fatalf("still holding %d after the stop", len(m.held))
	}
}
