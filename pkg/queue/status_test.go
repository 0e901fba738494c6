package queue_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// A lease says since when its owner holds it, and keeps saying so when renewed. Status
// shows each owner, whether it has a heartbeat, and the partitions no one holds.
func TestLeaseStatusSaysWhoHoldsWhatSinceWhen(t *testing.T) {
	t.Parallel()
	q := open(t, queue.Config{Partitions: 4})
	ctx := context.Background()
	if _, err := q.LeaseStatus(ctx); err != queue.ErrNoLeases {
		t.Fatalf("status before any lease: %v, want ErrNoLeases", err)
	}
	l, err := q.Leases(ctx, 30*time.Second) // no step of a loaded machine outlasts it
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now().UTC().Add(-time.Second)
	if err := l.Heartbeat(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	rev, ok, err := l.Acquire(ctx, 0, "a")
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	first, err := q.LeaseStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the renewal's time is the server's clock: let it move on
	if _, ok, err := l.Renew(ctx, 0, "a", rev); err != nil || !ok {
		t.Fatalf("renew: %v %v", ok, err)
	}
	if _, ok, err := l.Acquire(ctx, 2, "b"); err != nil || !ok { // b has no heartbeat
		t.Fatalf("acquire by b: %v %v", ok, err)
	}
	st, err := q.LeaseStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Instances) != 2 || st.Instances[0].ID != "a" || st.Instances[1].ID != "b" || st.TTL != 30*time.Second || st.Partitions != 4 {
		t.Fatalf("status: %+v, want a and b", st)
	}
	a := st.Instances[0]
	if a.Heartbeat.IsZero() || len(a.Leases) != 1 || a.Leases[0].Partition != 0 || a.Leases[0].Since.Before(before) ||
		!a.Leases[0].Since.Equal(first.Instances[0].Leases[0].Since) || !a.Leases[0].Renewed.After(first.Instances[0].Leases[0].Renewed) {
		t.Fatalf("a: %+v (before the renewal %+v), want partition 0 held since the acquisition, renewed since", a, first.Instances[0])
	}
	if b := st.Instances[1]; !b.Heartbeat.IsZero() || len(b.Leases) != 1 || b.Leases[0].Partition != 2 || b.Leases[0].Since.Before(before) {
		t.Fatalf("b: %+v, want partition 2 held since its acquisition, no heartbeat", b)
	}
	if !slices.Equal(st.Unowned, []int{1, 3}) {
		t.Fatalf("unowned %v, want 1 and 3", st.Unowned)
	}
	// The lease watch names each lease's owner: the dispatcher tells its own renewals from
	// others' by it (the early-expiry fence).
	seen := map[int]string{}
	done := make(chan struct{}, 8)
	stop, err := l.WatchLeases(ctx, func(c request.LeaseChange) {
		if !c.Heartbeat {
			seen[c.Partition] = c.Owner
			done <- struct{}{}
		}
	}, func(error) {})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("the lease watch did not report the leases in place within 30 s (%d of 2 reported)", i)
		}
	}
	stop()
	if seen[0] != "a" || seen[2] != "b" {
		t.Fatalf("the watch named owners %v, want a and b", seen)
	}
	owners, err := l.Owners(ctx)
	if err != nil || owners[0] != "a" || owners[2] != "b" {
		t.Fatalf("owners %v (%v), want a and b", owners, err)
	}
	if n, err := l.ReleaseAll(ctx, "a"); err != nil || n != 1 {
		t.Fatalf("release all of a: %d %v, want 1", n, err)
	}
}

// A read of a request's events whose answer never comes (a responder that took the
// request and went silent) ends after EventReadTimeout as unavailable, instead of
// holding the caller for as long as its context lasts.
func TestEventReadWithoutAnswerEnds(t *testing.T) {
	t.Parallel()
	s := queuetest.Server(t)
	q, err := queue.Open(context.Background(), queuetest.Conn(t, s), queue.Config{NoEvents: true}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	// No events stream, so JetStream does not answer; this subscriber takes the read and
	// says nothing.
	silent := queuetest.Conn(t, s)
	if _, err := silent.Subscribe("$JS.API.DIRECT.GET."+queue.EventStream, func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := silent.Flush(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := q.Events(context.Background(), "alice", request.NewID(time.Now()))
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, request.ErrUnavailable) {
			t.Fatalf("read ended with %v, want request.ErrUnavailable", err)
		}
		t.Logf("the read ended after %s: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(queue.EventReadTimeout + 10*time.Second):
		t.Fatalf("the read still waits %s after it began", time.Since(start).Round(time.Second))
	}
}

// Two events alike in all but their time (an attempt numbered 1 again by a dispatcher
// restarted under the same name) are both written: the second is not taken for a retried
// write of the first and dropped.
func TestEventsAlikeButForTheirTimeAreBothWritten(t *testing.T) {
	t.Parallel()
	q := open(t, queue.Config{})
	ctx := context.Background()
	id := request.NewID(time.Now())
	first := request.Event{Type: request.EventAttemptFailed, ID: id, ClientID: "alice", Attempt: 1, Seq: 7,
		Instance: "dispatcher/a", At: time.Now().Add(-time.Minute).UTC(), Status: 503}
	second := first
	second.At, second.Status = time.Now().UTC(), 502
	for _, e := range []request.Event{first, second} {
		if err := q.WriteEvent(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	events, err := q.Events(ctx, "alice", id)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 2 || events[0].Status != 503 || events[1].Status != 502 || !events[1].At.Equal(second.At) {
		t.Fatalf("events %+v, want both attempt_failed (503, then 502)", events)
	}

	// A final event written again (its write retried) is the one written first: the
	// request was delivered once.
	accepted := request.Event{Type: request.EventDelivered, ID: id, ClientID: "alice", Seq: 7, Instance: "dispatcher/a",
		At: time.Now().Add(-time.Minute).UTC()}
	again := accepted
	again.At = time.Now().UTC()
	for _, e := range []request.Event{accepted, again} {
		if err := q.WriteEvent(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	events, err = q.Events(ctx, "alice", id)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		if e.Type == request.EventDelivered && !e.At.Equal(accepted.At) {
			t.Fatalf("delivered event at %s, want the first one's %s", e.At, accepted.At)
		}
	}
}
