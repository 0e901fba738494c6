package queue_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// On a server whose max_payload is below what raven's kept answer makes of an event, the
// final event is still written, and kept in the queue (KeepOutcome), with the answer cut
// to fit: before, it could never be published, its write was retried forever and its
// request's removal with it.
func TestAnswerLargerThanMaxPayloadIsCut(t *testing.T) {
	t.Parallel()
	srv := queuetest.ServerWith(t, t.TempDir(), "127.0.0.1:0", func(o *server.Options) { o.MaxPayload = 64 << 10 })
	nc := queuetest.Conn(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q, err := queuetest.Open(ctx, nc, queue.Config{}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	big := request.NewResponse(200, http.Header{"Content-Type": {"text/plain"}}, []string{"Content-Type"}, []byte(strings.Repeat("a", 200<<10)), false)
	ev := request.Event{Type: request.EventDelivered, ID: request.NewID(time.Now()), ClientID: "zed", At: time.Now(), Attempt: 1, Status: 200, Response: big}

	w := q.NewEventWriter("test", 0, nil, zerolog.Nop())
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(runCtx, 5*time.Second) }()
	defer func() { stop(); <-done }()
	if !w.WriteNow(ctx, ev) {
		t.Fatal("the delivered event with a 200 KiB answer was not written on a server taking 64 KiB messages")
	}
	events, err := q.StatusEvents(ctx, "zed", ev.ID)
	if err != nil || len(events) != 1 || events[0].Response == nil {
		t.Fatalf("read back: %+v (%v)", events, err)
	}
	if r := events[0].Response; r.Status != 200 || !r.Truncated || r.BodyBytes == 0 || r.BodyBytes >= 64<<10 || r.Headers["Content-Type"] != "text/plain" {
		t.Fatalf("the answer read back: status %d, %d bytes, truncated %v, headers %v; want it cut under 64 KiB, the rest kept", r.Status, r.BodyBytes, r.Truncated, r.Headers)
	}
	if err := q.KeepOutcome(ctx, ev); err != nil {
		t.Fatalf("keeping the same event in the queue: %v", err)
	}
}

// While events wait unwritten (the stream not taking them), those past the first
// thousand wait without the body of raven's answer, its status and headers kept: what
// waits in memory is bounded by bytes as well as by count.
func TestWaitingEventsShedAnswerBodies(t *testing.T) {
	t.Parallel()
	srv := queuetest.Server(t)
	nc := queuetest.Conn(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q, err := queuetest.Open(ctx, nc, queue.Config{}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	answer := request.NewResponse(200, http.Header{"Content-Type": {"text/plain"}}, []string{"Content-Type"}, []byte("kept while few wait"), false)
	w := q.NewEventWriter("test", 0, nil, zerolog.Nop())
	ids := make([]string, 1002)
	for i := range ids {
		ids[i] = request.NewID(time.Now())
		w.Record(request.Event{Type: request.EventDelivered, ID: ids[i], ClientID: "yan", At: time.Now(), Attempt: 1, Status: 200, Response: answer})
	}
	runCtx, stop := context.WithCancel(context.Background())
	stop() // writes what waits, then returns
	w.Run(runCtx, time.Minute)
	for i, want := range map[int]string{0: "kept while few wait", 999: "kept while few wait", 1000: "", 1001: ""} {
		events, err := q.StatusEvents(ctx, "yan", ids[i])
		if err != nil || len(events) != 1 || events[0].Response == nil {
			t.Fatalf("event %d: %+v (%v)", i, events, err)
		}
		if r := events[0].Response; r.Body != want || r.Status != 200 || r.Headers["Content-Type"] != "text/plain" || (want == "") != r.Truncated {
			t.Errorf("event %d waited with %d before it: answer %+v, want body %q", i, i, r, want)
		}
	}
}
