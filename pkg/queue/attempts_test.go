package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// A request's earlier attempts are read from the record for the copy queued now: its
// client's last attempt_started and attempt_failed events, when they are the request's
// (the same id and queue sequence). An earlier request's, another copy's or another
// client's do not count.
func TestEarlierAttemptsAreTheQueuedCopysOwn(t *testing.T) {
	t.Parallel()
	_, q := openOnServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := runWriter(t, q, nil)
	id := request.NewID(time.Now())
	publish(t, q, "nia", id)
	publish(t, q, "nia", request.NewID(time.Now())) // behind it
	lane, _, ok, err := q.ClientLane(ctx, "nia")
	if err != nil || !ok {
		t.Fatalf("client lane: %v %v", ok, err)
	}
	st, _, err := q.Head(ctx, lane)
	if err != nil || st.ID != id {
		t.Fatalf("head %s %v, want %s", st.ID, err, id)
	}
	// An earlier request's failures are its client's last attempt events: none of st's.
	w.Record(request.Event{Type: request.EventAttemptFailed, ID: request.NewID(time.Now()), ClientID: "nia", Seq: st.Seq - 1, Attempt: 9, At: time.Now()})
	stored(t, w)
	if n, at, err := q.EarlierAttempts(ctx, st); n != 0 || !at.IsZero() || err != nil {
		t.Fatalf("before any attempt of it: %d, %v, %v; want none", n, at, err)
	}
	t0 := time.Now().Add(-time.Minute).UTC().Truncate(time.Millisecond)
	own := func(typ request.EventType, attempt int, at time.Time) request.Event {
		return request.Event{Type: typ, ID: id, ClientID: "nia", Seq: st.Seq, Attempt: attempt, At: at}
	}
	w.Record(own(request.EventAttemptFailed, 1, t0))
	w.Record(own(request.EventAttemptStarted, 2, t0.Add(10*time.Second)))
	w.Record(own(request.EventAttemptFailed, 2, t0.Add(20*time.Second)))
	w.Record(request.Event{Type: request.EventAttemptFailed, ID: id, ClientID: "noa", Seq: st.Seq, Attempt: 6, At: t0}) // another client's
	stored(t, w)
	if n, at, err := q.EarlierAttempts(ctx, st); err != nil || n != 2 || !at.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("after two attempts: %d at %v (%v); want 2, at the second's start %v", n, at, err, t0.Add(10*time.Second))
	}
	// Another copy of the id (another queue sequence) last on one subject: not counted.
	other := own(request.EventAttemptFailed, 7, t0)
	other.Seq = st.Seq + 100
	w.Record(other)
	stored(t, w)
	if n, at, err := q.EarlierAttempts(ctx, st); err != nil || n != 2 || !at.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("with another copy's failure last: %d at %v (%v); want 2 from its own start event", n, at, err)
	}

	// With events off there is no record to read.
	off := open(t, queue.Config{NoEvents: true})
	if n, _, err := off.EarlierAttempts(ctx, st); n != 0 || err != nil {
		t.Fatalf("events off: %d, %v; want none", n, err)
	}
}
