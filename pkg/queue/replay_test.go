package queue_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// deadLetterOne queues one request for client and moves it to the dead-letter stream as
// the dispatcher would; it returns the dead letter.
func deadLetterOne(t testing.TB, q *queue.Queue, client, id string) request.DeadLetter {
	t.Helper()
	ctx := context.Background()
	publish(t, q, client, id)
	lane, _, ok, err := q.ClientLane(ctx, client)
	if err != nil || !ok {
		t.Fatalf("client lane of %s: %v %v", client, ok, err)
	}
	st, _, err := q.Head(ctx, lane)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.AddDeadLetter(ctx, st, request.Verdict{Reason: request.ReasonPermanent, LastStatus: 400, Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	if err := q.Delete(ctx, st.Lane, st.Seq); err != nil {
		t.Fatal(err)
	}
	recs := deadLetters(t, q, queue.DeadFilter{ID: id})
	if len(recs) != 1 || recs[0].ID != id {
		t.Fatalf("dead letter %s not found: %+v", id, recs)
	}
	return recs[0]
}

// deadLetters collects the dead letters f selects.
func deadLetters(t testing.TB, q *queue.Queue, f queue.DeadFilter) []request.DeadLetter {
	t.Helper()
	var out []request.DeadLetter
	for r, err := range q.DeadLetters(context.Background(), f) {
		if err != nil {
			t.Fatalf("reading dead letters: %v", err)
		}
		out = append(out, r)
	}
	return out
}

// A replay that crashed after queueing a dead letter and before removing it queues it
// once when run again, and removes it then.
func TestRequeueAfterACrashQueuesOnce(t *testing.T) {
	t.Parallel()
	q := open(t, queue.Config{})
	ctx := context.Background()
	rec := deadLetterOne(t, q, "alice", "req-1")
	if rec.Reason != request.ReasonPermanent || rec.LastStatus != 400 || rec.AcceptedAt.IsZero() || rec.DeadAt.IsZero() {
		t.Fatalf("dead record %+v lacks its reason, status or times", rec)
	}

	if dup, err := q.RequeuePublishOnly(rec); err != nil || dup {
		t.Fatalf("first half of the requeue: duplicate %v, err %v", dup, err)
	}
	queued, _, err := q.Requeue(ctx, rec) // the rerun
	if err != nil || queued {
		t.Fatalf("requeue after the crash: queued %v, err %v; want it found already queued", queued, err)
	}
	backlog, _ := q.Backlog(ctx)
	total := uint64(0)
	for _, n := range backlog {
		total += n
	}
	if total != 1 {
		t.Fatalf("%d requests queued, want the one, once", total)
	}
	if dead := deadLetters(t, q, queue.DeadFilter{}); len(dead) != 0 {
		t.Fatalf("%d dead letters left, want 0", len(dead))
	}
	lane, _, _, _ := q.ClientLane(ctx, "alice")
	st, _, _ := q.Head(ctx, lane)
	if st.ID != "req-1" || string(st.Body) != `{"n":"req-1"}` || st.ContentType != "application/json" {
		t.Fatalf("requeued request %+v lost its id, body or content type", st)
	}
}

// A replay into a full backlog leaves the dead letter where it is.
func TestRequeueIntoAFullBacklogKeepsTheDeadLetter(t *testing.T) {
	t.Parallel()
	q := open(t, queue.Config{BacklogCap: 1})
	rec := deadLetterOne(t, q, "bob", "req-1")
	publish(t, q, "bob", "req-2") // fills bob's backlog
	_, _, err := q.Requeue(context.Background(), rec)
	if !errors.Is(err, request.ErrBacklogFull) {
		t.Fatalf("requeue into a full backlog: %v, want request.ErrBacklogFull", err)
	}
	if dead := deadLetters(t, q, queue.DeadFilter{}); len(dead) != 1 {
		t.Fatalf("%d dead letters, want the one kept", len(dead))
	}
}

// The control bucket: a client's record is changed field by field, a record left
// steering nothing is deleted, and the watch hears the current records then changes.
func TestControlRecordsAndWatch(t *testing.T) {
	t.Parallel()
	q := open(t, queue.Config{})
	ctx := context.Background()
	var badRecords bytes.Buffer
	ctl, err := q.Control(ctx, zerolog.New(&badRecords))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.UpdateClient(ctx, "carol", "test", func(s *request.Steering) { s.Paused = true }); err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.SetGlobalInterval(ctx, 7e9, "test"); err != nil {
		t.Fatal(err)
	}
	events := make(chan request.SteerChange, 16)
	cur, stop, err := ctl.WatchSteering(ctx, func(e request.SteerChange) { events <- e })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if len(cur) != 2 {
		t.Fatalf("watch began with %d records, want 2: %+v", len(cur), cur)
	}
	if _, err := ctl.UpdateClient(ctx, "carol", "test", func(s *request.Steering) { s.Paused = false }); err != nil {
		t.Fatal(err)
	}
	e := nextSteer(t, events, "carol resumed")
	if e.Client != request.EncodeClientID("carol") || !e.Steering.IsZero() {
		t.Fatalf("after resume the watch heard %+v, want carol back to no steering", e)
	}
	if clients, _ := ctl.Clients(ctx); len(clients) != 0 {
		t.Fatalf("steered clients after resume: %v, want none", clients)
	}
	if badRecords.Len() != 0 {
		t.Fatalf("the watch logged records it could not read: %s", badRecords.String())
	}
}

// A replayed request keeps its Not-Before while that is still ahead (one purged before
// its time must not go early), and has none once it has passed.
func TestRequeueKeepsANotBeforeStillAhead(t *testing.T) {
	t.Parallel()
	q := open(t, queue.Config{})
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		notBefore time.Time
		want      time.Time
	}{
		{"Ahead", time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond), time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)},
		{"Passed", time.Now().Add(-time.Hour), time.Time{}},
	} {
		client := "nb-" + tc.name
		if _, err := q.Publish(ctx, request.Request{ID: "req-" + tc.name, ClientID: client, Body: []byte("{}"), NotBefore: tc.notBefore}); err != nil {
			t.Fatal(err)
		}
		lane, _, _, _ := q.ClientLane(ctx, client)
		st, _, err := q.Head(ctx, lane)
		if err != nil || !st.NotBefore.Equal(tc.notBefore) {
			t.Fatalf("%s: stored %+v %v, want its Not-Before %s", tc.name, st, err, tc.notBefore)
		}
		// An operator purges the client's backlog: it is dead-lettered unsent.
		if err := q.AddDeadLetter(ctx, st, request.Verdict{Reason: request.ReasonPurged}); err != nil {
			t.Fatal(err)
		}
		if err := q.Delete(ctx, st.Lane, st.Seq); err != nil {
			t.Fatal(err)
		}
		dead := deadLetters(t, q, queue.DeadFilter{ID: st.ID})
		if len(dead) != 1 {
			t.Fatalf("%s: dead letters %+v, want one", tc.name, dead)
		}
		if _, _, err := q.Requeue(ctx, dead[0]); err != nil {
			t.Fatal(err)
		}
		st, _, err = q.Head(ctx, lane)
		if err != nil || st.ID != "req-"+tc.name || st.Cycle != 1 {
			t.Fatalf("%s: replayed %+v %v", tc.name, st, err)
		}
		if !st.NotBefore.Equal(tc.want) {
			t.Errorf("%s: replayed with Not-Before %s, want %s", tc.name, st.NotBefore, tc.want)
		}
	}
}
