package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// A request's earlier attempts are read from the record for the copy queued now: the
// highest attempt number of its attempt events and the earliest of them. Events of
// another copy of the same id (another queue sequence), of another cycle, of another
// request or client do not count.
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
	if n, first, err := q.EarlierAttempts(ctx, st); n != 0 || !first.IsZero() || err != nil {
		t.Fatalf("before any attempt: %d, %v, %v; want none", n, first, err)
	}
	first := time.Now().Add(-time.Minute).UTC().Truncate(time.Millisecond)
	own := func(typ request.EventType, attempt int, at time.Time) request.Event {
		return request.Event{Type: typ, ID: id, ClientID: "nia", Seq: st.Seq, Attempt: attempt, At: at}
	}
	w.Record(own(request.EventAttemptFailed, 1, first))
	w.Record(own(request.EventAttemptStarted, 2, first.Add(10*time.Second)))
	w.Record(own(request.EventAttemptFailed, 2, first.Add(20*time.Second)))
	other := own(request.EventAttemptFailed, 9, first.Add(-time.Hour))
	other.Seq = st.Seq + 100 // another copy of the id
	w.Record(other)
	cycle := own(request.EventAttemptFailed, 8, first.Add(-time.Hour))
	cycle.Cycle = 1
	w.Record(cycle)
	w.Record(request.Event{Type: request.EventAttemptFailed, ID: request.NewID(time.Now()), ClientID: "nia", Seq: st.Seq + 1, Attempt: 7, At: first.Add(-time.Hour)})
	w.Record(request.Event{Type: request.EventAttemptFailed, ID: id, ClientID: "noa", Seq: st.Seq, Attempt: 6, At: first.Add(-time.Hour)})
	stored(t, w)
	n, got, err := q.EarlierAttempts(ctx, st)
	if err != nil || n != 2 || !got.Equal(first) {
		t.Fatalf("earlier attempts: %d from %v (%v); want 2 from %v", n, got, err, first)
	}

	// With events off there is no record to read.
	off := open(t, queue.Config{NoEvents: true})
	if n, _, err := off.EarlierAttempts(ctx, st); n != 0 || err != nil {
		t.Fatalf("events off: %d, %v; want none", n, err)
	}
}
