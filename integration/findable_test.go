package integration

import (
	"context"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/client"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// A request delayed past STATUS_RETENTION, and one queued behind it, are found for as
// long as they are queued, with no stored event (their acceptance is not stored, ADR 18;
// before, it expired with STATUS_RETENTION): ingest asks the dispatchers, which find them in the queue itself (issue 34). Before, both read
// unknown while they still waited. They are then delivered, and read so.
func TestQueuedRequestOutlivesItsRecord(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{interval: 100 * time.Millisecond})
	c := goClient(t, s.ingestBase())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	notBefore := time.Now().Add(30 * time.Second).Truncate(time.Second)
	head, err := c.Submit(ctx, "dora", []byte(`{"n":1}`), client.WithNotBefore(notBefore))
	if err != nil {
		t.Fatal(err)
	}
	behind, err := c.Submit(ctx, "dora", []byte(`{"n":2}`))
	if err != nil {
		t.Fatal(err)
	}
	s.accept("dora", head.ID, behind.ID)
	// Neither has a stored event: the queue holds them (ADR 18).
	s.hasNoRecord(ctx, "dora", head.ID, behind.ID)
	if time.Now().After(notBefore.Add(-10 * time.Second)) { // the reads below must come well before it
		t.Skip("the machine took until the delayed request's time to get here; nothing left to check")
	}
	st, err := c.Status(ctx, "dora", head.ID)
	if err != nil || st.State != client.StatusQueued || !st.NotBefore.Equal(notBefore) || st.AcceptedAt.IsZero() || st.Queue == nil || st.Queue.Backlog != 2 {
		t.Fatalf("the delayed request without its record: %+v %+v (%v), want queued until %s, 2 in its client's queue", st, st.Queue, err, notBefore)
	}
	if st, err := c.Status(ctx, "dora", behind.ID); err != nil || st.State != client.StatusQueued {
		t.Fatalf("the request behind it: %+v (%v), want queued", st, err)
	}
	if st, err := c.Status(ctx, "dora", request.NewID(time.Now().Add(-time.Minute))); err != nil || st.State != client.StatusUnknown {
		t.Fatalf("an id never accepted: %+v (%v), want unknown", st, err)
	}
	for _, id := range []string{head.ID, behind.ID} {
		st, err := c.Wait(ctx, "dora", id)
		if err != nil || st.State != client.StatusDelivered {
			t.Fatalf("%s: %+v (%v), want delivered", id, st, err)
		}
	}
	s.finish(15*time.Second, 0)
}

// hasNoRecord checks that clientID's requests ids have no stored event: a queued
// request not attempted yet has none (ADR 18), as one delayed past STATUS_RETENTION had
// none once its accepted event expired.
func (s *stack) hasNoRecord(ctx context.Context, clientID string, ids ...string) {
	s.t.Helper()
	for _, id := range ids {
		if ev, err := s.q.StatusEvents(ctx, clientID, id); err != nil || len(ev) != 0 {
			s.t.Fatalf("%s: %v (%v), want no events", id, ev, err)
		}
	}
}
