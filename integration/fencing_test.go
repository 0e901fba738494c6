package integration

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/integration/itest"
	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/lease"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/raven"
)

// cutOff is a real lease store that can be cut off, as an instance that loses its way to
// the lease bucket while it can still reach raven would see it.
type cutOff struct {
	lease.Store
	cut atomic.Bool
}

var errCut = errors.New("cut off from the lease store")

func (c *cutOff) Heartbeat(ctx context.Context, id string) error {
	if c.cut.Load() {
		return errCut
	}
	return c.Store.Heartbeat(ctx, id)
}

func (c *cutOff) Members(ctx context.Context) ([]string, error) {
	if c.cut.Load() {
		return nil, errCut
	}
	return c.Store.Members(ctx)
}

func (c *cutOff) Acquire(ctx context.Context, p int, owner string) (uint64, bool, error) {
	if c.cut.Load() {
		return 0, false, errCut
	}
	return c.Store.Acquire(ctx, p, owner)
}

func (c *cutOff) Renew(ctx context.Context, p int, owner string, rev uint64) (uint64, bool, error) {
	if c.cut.Load() {
		return 0, false, errCut
	}
	return c.Store.Renew(ctx, p, owner, rev)
}

// The fencing argument, tested: instance a holds the only partition and is cut off from
// the lease store while it can still reach raven and the queue. It must stop starting
// attempts before its lease can lapse; b takes the partition after the lease expired and
// waits one interval before its first attempt. Spacing holds across the switch, and b
// makes the later deliveries. Without b's half of the fence, the gap at the switch falls
// below the interval (the margin here, the send timeout and a tenth of the TTL, is
// shorter than the interval): shown once, 8 short gaps. a's half is not observable here
// (a real store notices the lapse late enough that a's loss of the lease ends its sends
// in time); the unit tests and the simulation of pkg/dispatch catch its removal. In
// seconds, so that a prompt answer seldom outlasts the send timeout on a loaded machine;
// one that does is retried an interval later, a duplicate the dispatcher's log explains
// (an attempt that timed out and that raven accepted), as in the fault tests: at least
// once, never closer than the interval.
func TestFencingAcrossLeaseTakeover(t *testing.T) {
	t.Parallel()
	const interval, ttl, timeout = 4 * time.Second, 4 * time.Second, 1500 * time.Millisecond
	s := newStack(t, options{interval: interval, noStart: true, queue: queue.Config{Partitions: 1}})
	leases, err := s.q.Leases(context.Background(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := raven.New(raven.Config{URL: s.ravenURL, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	var logs itest.Buffer // both instances' lines at info and above, to explain duplicates
	start := func(id string, store lease.Store) func() {
		d, err := dispatch.New(dispatch.Config{Policy: s.policy(), SendTimeout: timeout,
			Leases: store, LeaseTTL: ttl, InstanceID: id}, s.q, rc, testLogAlso(&logs))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = d.Run(ctx); close(done) }()
		return func() { cancel(); <-done }
	}
	storeA := &cutOff{Store: leases}
	stopA := start("a", storeA)
	defer stopA()
	s.post("warm-up", 0)
	waitFor(t, time.Minute, "a past its start-up fence", func() bool { return s.ledger.Delivered() >= 1 })
	// Clients start a twelfth of an interval apart, so that whenever a's lease runs out,
	// some client's last attempt by a falls just before it.
	for c := range 12 {
		s.queueDirect(clientName(c), 6)
		time.Sleep(interval / 12)
	}
	// a mid-backlog: every client sent about twice, four times left each (by progress,
	// not a sleep; and queued directly: posts through ingest took half a minute on a
	// loaded machine, while a sent most of the backlog).
	waitFor(t, time.Minute, "a to have sent 24", func() bool { return s.ledger.Delivered() >= 25 })
	stopB := start("b", leases)
	defer stopB()

	storeA.cut.Store(true)
	cutAt := time.Now()
	s.waitDone(2 * time.Minute)
	owners, err := leases.Owners(context.Background()) // before b stops, which hands its lease back
	if err != nil {
		t.Fatal(err)
	}
	stopB()
	stopA()
	s.checkExplained(logs.String())

	var afterCut int
	for _, a := range s.ledger.Arrivals() {
		if a.Start.After(cutAt) {
			afterCut++
		}
	}
	if afterCut < 24 || owners[0] != "b" {
		t.Fatalf("%d arrivals after a was cut off, partition owned by %q: want b to have taken over and sent the rest", afterCut, owners[0])
	}
}
