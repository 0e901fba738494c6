package queue_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// A status read without a record asks the dispatchers whether the request is queued.
// They find it by direct gets from the time in its id, among other clients' requests and
// its own client's others; a keyed id (no time) and an id whose time is far from when it
// was stored are found by the scan; an id not queued is answered not found, never a
// guess; and many asks at once are all answered.
func TestQueuedLookups(t *testing.T) {
	t.Parallel()
	t.Run("OneNode", func(t *testing.T) {
		t.Parallel()
		testQueuedLookups(t, openServingLookups(t))
	})
	// A replicated stream takes no direct gets (queue.go): the lookup reads from the
	// stream's leader.
	t.Run("ThreeReplicas", func(t *testing.T) {
		t.Parallel()
		c := queuetest.NewCluster(t, 3)
		nc, err := nats.Connect(c.URL(), nats.Timeout(queuetest.DialTimeout))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		q, err := queuetest.Open(ctx, nc, queue.Config{Replicas: 3}, queue.CreateOrUpdate)
		if err != nil {
			t.Fatal(err)
		}
		stop, err := q.ServeQueuedLookups()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
		testQueuedLookups(t, q)
	})
}

func testQueuedLookups(t *testing.T, q *queue.Queue) {
	ctx := context.Background()
	type sent struct {
		client, id string
		seq        uint64
	}
	var all []sent
	for i := range 120 {
		c, id := fmt.Sprint("c", i%40), request.NewID(time.Now())
		all = append(all, sent{c, id, publish(t, q, c, id).Seq})
	}
	keyed := request.IDFromKey("", "c7", "order-1")
	all = append(all, sent{"c7", keyed, publish(t, q, "c7", keyed).Seq})
	old := request.NewID(time.Now().Add(-10 * time.Minute)) // ingest's clock far behind the server's
	all = append(all, sent{"c8", old, publish(t, q, "c8", old).Seq})

	var wg sync.WaitGroup
	for _, s := range all {
		wg.Go(func() {
			f, ok, err := q.AskQueued(ctx, s.client, s.id)
			if err != nil || !ok || f.Seq != s.seq {
				t.Errorf("lookup of %s/%s: found %v seq %d, %v; want found at %d", s.client, s.id, ok, f.Seq, err, s.seq)
			}
		})
	}
	wg.Wait()

	for _, s := range all[:5] {
		at, _ := request.IDTime(s.id)
		if ok, err := q.LookupNear(ctx, s.id, s.client, at); err != nil || !ok {
			t.Errorf("the direct reads did not find %s/%s: %v, %v", s.client, s.id, ok, err)
		}
	}
	at, _ := request.IDTime(old)
	if ok, err := q.LookupNear(ctx, old, "c8", at); err != nil || ok {
		t.Errorf("the direct reads found %s ten minutes from its id's time (%v, %v): the test does not reach the scan", old, ok, err)
	}

	for _, miss := range []sent{{"c1", request.NewID(time.Now()), 0}, {"c1", all[2].id, 0}, {"nobody", request.IDFromKey("", "nobody", "k"), 0}} {
		if _, ok, err := q.AskQueued(ctx, miss.client, miss.id); err != nil || ok {
			t.Errorf("lookup of %s/%s, not queued: found %v, %v; want not found", miss.client, miss.id, ok, err)
		}
	}
}

// A request removed while the events stream did not take its final event has that event
// kept in the request stream (ADR 9): the lookup says it is not queued and gives the kept
// event, so the status read answers its outcome rather than unknown.
func TestALookupGivesAFinalEventKeptInTheRequestStream(t *testing.T) {
	t.Parallel()
	q := openServingLookups(t)
	ctx := context.Background()
	id := request.NewID(time.Now())
	other := request.Event{Type: request.EventDelivered, ID: request.NewID(time.Now()), ClientID: "ada", At: time.Now(), Attempt: 1, Status: 200}
	mine := request.Event{Type: request.EventDelivered, ID: id, ClientID: "ada", At: time.Now(), Attempt: 1, Status: 200}
	for _, e := range []request.Event{other, mine} {
		if err := q.KeepOutcome(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	f, ok, err := q.AskQueued(ctx, "ada", id)
	if err != nil || ok || len(f.Kept) != 1 || f.Kept[0].ID != id || f.Kept[0].Type != request.EventDelivered {
		t.Fatalf("lookup of a request delivered with its final event kept: found %v, kept %+v, %v; want not queued with its delivered event", ok, f.Kept, err)
	}
	if f, _, err := q.AskQueued(ctx, "bob", id); err != nil || len(f.Kept) != 0 {
		t.Fatalf("another client's lookup of the id: kept %+v, %v; want none", f.Kept, err)
	}
}

// openServingLookups opens a queue on a server of its own that answers the lookups
// asked of the dispatchers.
func openServingLookups(t *testing.T) *queue.Queue {
	t.Helper()
	q := open(t, queue.Config{})
	stop, err := q.ServeQueuedLookups()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return q
}
