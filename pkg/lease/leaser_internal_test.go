package lease

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/rs/zerolog"
)

// Directed tests of the fences the simulation (pkg/dispatch/dispatchsim) found broken:
// each drives the leaser's view of the lease watch by hand, and fails on the code before
// its fix. The simulation's TestSimulationFindings keeps the seeds that found them.

// watchOnly is a lease store whose watch starts and delivers nothing by itself: the
// test hands the leaser its events.
type watchOnly struct {
	Store
	written bool
}

func (watchOnly) WatchLeases(context.Context, func(request.LeaseChange), func(error)) (func(), error) {
	return func() {}, nil
}

func (w watchOnly) Written(context.Context) (bool, error) { return w.written, nil }

const testTTL = 10 * time.Second

var start = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// clock is the test's clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// watchingLeaser is a Leaser of 8 partitions on store, its clock at start (TTL 10 s, a
// send timeout of 1 s as the dispatcher counts its margin), its watch begun.
func watchingLeaser(t *testing.T, store Store, fresh bool) (*Leaser, *clock) {
	t.Helper()
	c := &clock{t: start}
	margin := time.Second + testTTL/10
	m := New(Config{Store: store, ID: "unit", Partitions: 8, TTL: testTTL, Margin: margin, Every: (testTTL - margin) / 3,
		Now: c.now, Log: zerolog.Nop()}, make(chan Event, 16))
	m.fresh = fresh
	m.watch(context.Background(), func() {})
	return m, c
}

// A holds p3 and renews it; the store's clock removes A's lease unseen; B takes p3 and
// hands it back; C takes it. A may send until a TTL after its renewal: C must not start
// before then. (The release used to forget every renewal of p3, A's with B's.)
func TestAReleaseKeepsAnEarlierHoldersFence(t *testing.T) {
	t.Parallel()
	m, c := watchingLeaser(t, watchOnly{written: true}, false)
	c.advance(2 * testTTL) // the watch has run for longer than a TTL: nothing unseen
	renewed := c.now()
	m.saw(request.LeaseChange{Partition: 3, Owner: "a", Released: false, Rev: 10})
	c.advance(2 * time.Second)
	m.saw(request.LeaseChange{Partition: 3, Owner: "b", Released: false, Rev: 11}) // b takes p3 after a's lease vanished
	c.advance(time.Second)
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
	m, c := watchingLeaser(t, watchOnly{written: true}, false)
	began := c.now()
	c.advance(time.Second)
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
	m, c := watchingLeaser(t, store, false)
	now := c.now()
	m.held[1] = &holding{rev: 1, fence: now.Add(-time.Second)} // past its fence
	m.held[2] = &holding{rev: 2, fence: now.Add(time.Second)}  // an earlier holder may still send
	m.ReleaseAll(context.Background())
	if store.all || len(store.released) != 1 || store.released[0] != 1 {
		t.Fatalf("released %v (all: %v), want partition 1 alone", store.released, store.all)
	}
	if len(m.held) != 0 {
		t.Fatalf("still holding %d after the stop", len(m.held))
	}
}
