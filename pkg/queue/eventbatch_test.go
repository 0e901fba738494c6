package queue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// batchEvents makes n events over a few clients, several for each request, in the order a
// writer must store them.
func batchEvents(n int) []request.Event {
	evs := make([]request.Event, 0, n)
	t0 := time.Now()
	for i := 0; len(evs) < n; i++ {
		id, client := request.NewID(t0.Add(time.Duration(i)*time.Millisecond)), fmt.Sprintf("c%d", i%7)
		for _, typ := range []request.EventType{request.EventAttemptStarted, request.EventAttemptFailed, request.EventDelivered} {
			if len(evs) < n {
				evs = append(evs, request.Event{Type: typ, ID: id, ClientID: client, Attempt: 1, At: t0})
			}
		}
	}
	return evs
}

// writeAll records evs with a writer that is not running yet, so that they wait together
// as a dispatcher's do under load, then runs it until they are written. It checks that
// the stream holds them in the order recorded, each once, and that the writer counted
// batches atomic batches and every event as written.
func writeAll(t *testing.T, nc *nats.Conn, q *queue.Queue, evs []request.Event, batches float64) {
	t.Helper()
	reg := prometheus.NewRegistry()
	w := q.NewEventWriter("test", 0, reg, zerolog.Nop())
	for _, e := range evs {
		w.Record(e)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // stopped before it starts: it writes what waits, then returns
	w.Run(ctx, time.Minute)
	sameKeys(t, storedEvents(t, nc), eventKeys(evs))
	if n := counter(t, reg, "dispatch_event_batches_total"); n != batches {
		t.Fatalf("%v atomic batches written, want %v", n, batches)
	}
	if n := counter(t, reg, "dispatch_events_written_total"); n != float64(len(evs)) {
		t.Fatalf("%v events counted as written, want %d", n, len(evs))
	}
}

// eventStream is the events stream as the server holds it.
func eventStream(t *testing.T, ctx context.Context, nc *nats.Conn) (jetstream.JetStream, jetstream.Stream) {
	t.Helper()
	js, _ := jetstream.New(nc)
	stream, err := js.Stream(ctx, queue.EventStream)
	if err != nil {
		t.Fatal(err)
	}
	return js, stream
}

// storedEvents reads the events stream whole: each event's request id and type.
func storedEvents(t *testing.T, nc *nats.Conn) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, stream := eventStream(t, ctx, nc)
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m.Header.Get(request.EventIDHeader)+" "+m.Subject[len(request.EventPrefix):])
	}
	return got
}

func eventKeys(evs []request.Event) []string {
	keys := make([]string, len(evs))
	for i, e := range evs {
		keys[i] = e.ID + " " + e.Subject()[len(request.EventPrefix):]
	}
	return keys
}

func sameKeys(t *testing.T, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("the events stream holds %d events, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("event %d stored is %q, want %q (in the order recorded)", i, got[i], want[i])
		}
	}
}

// Events waiting together are stored in the order recorded, in chunks of at most 1,000;
// the writer measures both ways of writing before it chooses (writeCosts): the first
// chunk goes as one atomic batch, the second one by one.
func TestEventWriterStoresWaitingEventsInBatches(t *testing.T) {
	t.Parallel()
	nc, q := openOnServer(t)
	writeAll(t, nc, q, batchEvents(1500), 1) // 1,000 events; the other 500 one by one
}

// A batch holding an event already stored (a write retried after its acknowledgement was
// lost) is refused whole by the server; the writer then writes its events one by one, and
// the one already there is stored once.
func TestEventWriterBatchWithAnEventAlreadyStored(t *testing.T) {
	t.Parallel()
	nc, q := openOnServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	evs := batchEvents(30)
	evs[0].Instance = "test" // as the writer names itself: the same message id
	if err := q.WriteEvent(ctx, evs[0]); err != nil {
		t.Fatal(err)
	}
	writeAll(t, nc, q, evs, 0) // the server refuses a batch with a duplicate
}
