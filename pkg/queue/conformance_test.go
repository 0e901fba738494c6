package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/dispatch/dispatchsim"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// The lease bucket and the request stream pass the suites the simulation's fakes are
// held to: what the simulation assumes of them is true of them.
func TestLeaseStoreConformance(t *testing.T) {
	t.Parallel()
	dispatchsim.ConformLeaseStore(t, func(t *testing.T) dispatchsim.LeaseStoreUnderTest {
		s := queuetest.Server(t)
		nc := queuetest.Conn(t, s)
		q, err := queue.Open(context.Background(), nc, queue.Config{}, queue.CreateOrUpdate)
		if err != nil {
			t.Fatal(err)
		}
		l, err := q.Leases(context.Background(), 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return dispatchsim.LeaseStoreUnderTest{Store: l, Expire: func() {
			if err := queuetest.ExpireLeases(context.Background(), nc); err != nil {
				t.Fatalf("expiring the leases: %v", err)
			}
		}}
	})
}

func TestSourceConformance(t *testing.T) {
	t.Parallel()
	dispatchsim.ConformSource(t, func(t *testing.T) dispatchsim.SourceUnderTest {
		q := open(t, queue.Config{})
		return dispatchsim.SourceUnderTest{Source: q, Add: func(client, id string) {
			if _, err := q.Publish(context.Background(), request.Request{ID: id, ClientID: client, ContentType: "application/json", Body: []byte(`{}`)}); err != nil {
				t.Fatalf("publish: %v", err)
			}
		}}
	})
}

// A backlog watch stopped deletes its consumer from the server: a dispatcher starts
// its watch again whenever its partitions move (ADR 16), and an ordered consumer would
// otherwise stay for its 5 minutes of inactivity.
func TestAStoppedWatchLeavesNoConsumer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := open(t, queue.Config{})
	for range 3 {
		stop, err := q.Watch(ctx, []int{1, 2}, func(request.Lane) {}, func(error) {})
		if err != nil {
			t.Fatal(err)
		}
		if n, err := q.RequestConsumers(ctx); err != nil || n != 1 {
			t.Fatalf("consumers of the request stream while watching: %d, %v; want 1", n, err)
		}
		stop()
		deadline := time.Now().Add(10 * time.Second)
		for n, _ := q.RequestConsumers(ctx); n != 0; n, _ = q.RequestConsumers(ctx) {
			if time.Now().After(deadline) {
				t.Fatalf("%d consumers of the request stream 10 s after the watch stopped; want none", n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// A watch whose consumer is lost before it gave anything (deleted on the server here;
// a reconnect does the same) is created again from where it began, not from "new": a
// request stored meanwhile still comes through it.
func TestAWatchCreatedAgainGivesWhatWasStoredMeanwhile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := open(t, queue.Config{})
	lanes := make(chan request.Lane, 4)
	all := make([]int, q.Partitions())
	for p := range all {
		all[p] = p
	}
	stop, err := q.Watch(ctx, all, func(l request.Lane) { lanes <- l }, func(error) {})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := q.DeleteRequestConsumers(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Publish(ctx, request.Request{ID: request.NewID(time.Now()), ClientID: "c1", ContentType: "application/json", Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lanes:
	case <-time.After(10 * time.Second):
		t.Fatal("the request stored while the watch's consumer was lost never came through the watch")
	}
}
