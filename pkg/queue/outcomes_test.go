package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// A final event kept in the request stream is stored once however often it is kept, is
// no request to the dispatchers (the backlog does not list it), and reaches the events,
// and so the request's status, once drained; the drain leaves nothing behind, not even
// a message that is no event.
func TestAKeptFinalEventReachesTheStatus(t *testing.T) {
	t.Parallel()
	nc := queuetest.Conn(t, queuetest.Server(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q, err := queue.Open(ctx, nc, queue.Config{}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	q.ObserveOutcomes(reg, zerolog.Nop())
	id := request.NewID(time.Now())
	rec, err := q.Publish(ctx, request.Request{ID: id, ClientID: "alice", Body: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	// Something else published on an outcome subject first (only dispatchers may, but a
	// server without users lets anyone): removed unwritten, it does not stop the drain.
	js, _ := jetstream.New(nc)
	if _, err := js.Publish(ctx, request.OutcomePrefix+"junk", []byte("not an event")); err != nil {
		t.Fatal(err)
	}
	ev := request.Event{Type: request.EventDelivered, ID: id, ClientID: "alice", Seq: rec.Seq, Attempt: 1, Status: 202, At: time.Now(), Instance: "d1"}
	for range 2 { // a retried keep whose acknowledgement was lost
		if err := q.KeepOutcome(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if n := queuetest.KeptOutcomes(t, nc); n != 2 {
		t.Fatalf("%d messages on outcome subjects after the junk and one event kept twice, want 2", n)
	}
	backlog, err := q.Backlog(ctx)
	if err != nil || len(backlog) != 1 {
		t.Fatalf("backlog %v (%v): want alice's subject alone; a kept event is no request", backlog, err)
	}
	if st, err := q.Stats(ctx); err != nil || st.Requests != 1 || st.Clients != 1 {
		t.Fatalf("stats %+v (%v): want alice's one request; a kept event is no request", st, err)
	}
	if st, err := q.Status(ctx, id); err != nil || st.State == request.StateDelivered {
		t.Fatalf("status before the drain: %+v %v; the event is not in the events stream yet", st, err)
	}

	dctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); q.DrainOutcomes(dctx, 50*time.Millisecond) }()
	defer func() { stop(); <-done }()
	for {
		st, err := q.Status(ctx, id)
		if err == nil && st.State == request.StateDelivered && st.RavenStatus == 202 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("status %+v (%v) a minute into the drain, want delivered with raven's 202", st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for queuetest.KeptOutcomes(t, nc) != 0 {
		if ctx.Err() != nil {
			t.Fatal("the drained event is still in the request stream")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := q.OutcomeCount("kept"); got != 1 {
		t.Fatalf("dispatch_outcomes_kept_total %v, want 1 (the second keep was the same write)", got)
	}
}

// A request stream too full to keep a final event is no error: the removal that follows
// must not wait on it (it would hold every lane while the stream is full). It is counted.
func TestAFullStreamDoesNotHoldTheRemoval(t *testing.T) {
	t.Parallel()
	nc := queuetest.Conn(t, queuetest.Server(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q, err := queue.Open(ctx, nc, queue.Config{BacklogCap: 1}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	q.ObserveOutcomes(nil, zerolog.Nop())
	for i := range 2 {
		ev := request.Event{Type: request.EventDelivered, ID: request.NewID(time.Now()), ClientID: "bob", Seq: uint64(i + 1), At: time.Now()}
		if err := q.KeepOutcome(ctx, ev); err != nil {
			t.Fatalf("keep %d: %v, want none (one per subject fits; the second is counted, not an error)", i, err)
		}
	}
	if got := q.OutcomeCount("not_kept"); got != 1 {
		t.Fatalf("dispatch_outcomes_not_kept_total %v, want 1", got)
	}
}
