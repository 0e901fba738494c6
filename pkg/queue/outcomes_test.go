package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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
	nc, q, ctx := openForOutcomes(t, queue.Config{})
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
	if heads, _, err := q.OldestHeads(ctx, 10, 1000); err != nil || len(heads) != 1 || heads[0].ClientID != "alice" {
		t.Fatalf("oldest heads %+v (%v): want alice's alone; a kept event is no client's head", heads, err)
	}
	if st, err := q.Stats(ctx); err != nil || st.Requests != 1 || st.Clients != 1 {
		t.Fatalf("stats %+v (%v): want alice's one request; a kept event is no request", st, err)
	}
	if st, err := q.Status(ctx, "alice", id); err != nil || st.State == request.StateDelivered {
		t.Fatalf("status before the drain: %+v %v; the event is not in the events stream yet", st, err)
	}

	dctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); q.DrainOutcomes(dctx, 50*time.Millisecond) }()
	defer func() { stop(); <-done }()
	for {
		st, err := q.Status(ctx, "alice", id)
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
	_, q, ctx := openForOutcomes(t, queue.Config{BacklogCap: 1})
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

// A kept event the events stream already holds is not written again (after the
// duplicate window it would reach penguin's feed twice), nor one of an earlier replay
// cycle than the request's latest (it would hide that cycle's own final event); both
// are removed all the same.
func TestTheDrainWritesOnlyWhatIsMissing(t *testing.T) {
	t.Parallel()
	nc, q, ctx := openForOutcomes(t, queue.Config{DuplicateWindow: time.Second})
	landed := request.Event{Type: request.EventDelivered, ID: request.NewID(time.Now()), ClientID: "ann", Seq: 7, Attempt: 1, At: time.Now(), Instance: "d1"}
	if err := q.WriteEvent(ctx, landed); err != nil { // the writer's copy
		t.Fatal(err)
	}
	old := request.Event{Type: request.EventDeadLettered, ID: request.NewID(time.Now()), ClientID: "ann", Seq: 8, Reason: request.ReasonPermanent, At: time.Now(), Instance: "d1"}
	replayed := request.Event{Type: request.EventReplayed, ID: old.ID, ClientID: "ann", Seq: 9, Cycle: 1, At: time.Now()}
	if err := q.WriteEvent(ctx, replayed); err != nil { // the request moved on
		t.Fatal(err)
	}
	for _, e := range []request.Event{landed, old} {
		if err := q.KeepOutcome(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(1500 * time.Millisecond) // past the duplicate window: only the drain's check stops a second copy
	js, _ := jetstream.New(nc)
	events, err := js.Stream(ctx, queue.EventStream)
	if err != nil {
		t.Fatal(err)
	}
	dctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); q.DrainOutcomes(dctx, 50*time.Millisecond) }()
	defer func() { stop(); <-done }()
	for queuetest.KeptOutcomes(t, nc) != 0 {
		if ctx.Err() != nil {
			t.Fatal("the kept events were not drained")
		}
		time.Sleep(50 * time.Millisecond)
	}
	info, err := events.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("%d events stored, want the 2 written before the drain: it wrote what was there or superseded", info.State.Msgs)
	}
	if st, err := q.Status(ctx, "ann", old.ID); err != nil || st.State != request.StateQueued || st.Replays != 1 {
		t.Fatalf("the replayed request's status %+v (%v), want queued in its first replay", st, err)
	}
}

// openForOutcomes opens the queue with cfg on a server of its own, and a minute's context.
func openForOutcomes(t *testing.T, cfg queue.Config) (*nats.Conn, *queue.Queue, context.Context) {
	t.Helper()
	nc := queuetest.Conn(t, queuetest.Server(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	q, err := queue.Open(ctx, nc, cfg, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	return nc, q, ctx
}
