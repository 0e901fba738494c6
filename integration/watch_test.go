package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/integration/itest"
	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/lease"
	"github.com/penguinhq/dispatcher/pkg/raven"
)

// Each dispatcher watches the partitions it owns, and starts its watch again as they
// move (ADR 16). With the 30-second relisting turned off, every request reaches its owner
// through the watches and the listings alone while instances join and leave: a request
// of a client of its own arrives every 20 ms all through the moves (one a later request
// of its client would not rescue), and each is delivered, spaced, once.
func TestNewRequestsReachTheirOwnerAcrossMoves(t *testing.T) {
	t.Parallel()
	const interval, ttl = 250 * time.Millisecond, 3 * time.Second
	s := newStack(t, options{interval: interval, noStart: true})
	leases, err := s.q.Leases(context.Background(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := raven.New(raven.Config{URL: s.ravenURL, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var logs itest.Buffer
	start := func(id string, store lease.Store) func() {
		d, err := dispatch.New(dispatch.Config{Policy: s.policy(), SendTimeout: 2 * time.Second,
			Leases: store, LeaseTTL: ttl, InstanceID: id, ResyncEvery: time.Hour}, s.q, rc, testLogAlso(&logs))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = d.Run(ctx); close(done) }()
		stopped := false
		return func() {
			if !stopped {
				stopped = true
				cancel()
				<-done
			}
		}
	}
	stopA := start("a", leases)
	defer stopA()
	feeding := make(chan struct{})
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		for n := 0; ; n++ {
			select {
			case <-feeding:
				return
			case <-time.After(20 * time.Millisecond):
			}
			s.queueDirect(fmt.Sprintf("one-%04d", n), 1)
		}
	}()
	// The moves: b and c join, a leaves, b leaves; each a rebalance of the 64 partitions.
	// Requests arrive through each (counted at each move: a slow machine stores fewer,
	// but some, in every stretch).
	var stored []int
	move := func(wait time.Duration, do func()) {
		time.Sleep(wait)
		stored = append(stored, s.acceptedCount())
		do()
	}
	stopB := start("b", leases)
	defer stopB()
	stopC := func() {}
	move(2*ttl, func() { stopC = start("c", leases) })
	defer func() { stopC() }()
	move(2*ttl, stopA)
	move(2*ttl, stopB)
	move(ttl/2, func() { close(feeding) })
	<-fed
	s.waitDone(2 * time.Minute)
	stopC()
	rep := s.checkExplained(logs.String())
	for i := 1; i < len(stored); i++ {
		if stored[i] <= stored[i-1] {
			t.Fatalf("requests stored by each move %v: none between moves %d and %d", stored, i, i+1)
		}
	}
	if rep.Delivered != s.acceptedCount() {
		t.Fatalf("delivered %d of %d", rep.Delivered, s.acceptedCount())
	}
	t.Logf("%d requests through the moves (stored by each: %v)", rep.Delivered, stored)
}
