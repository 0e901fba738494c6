package queue_test

import (
	"context"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/record"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// openOnServer opens the queue on a server of its own, with the defaults.
func openOnServer(t *testing.T) (*nats.Conn, *queue.Queue) {
	t.Helper()
	nc := queuetest.Conn(t, queuetest.Server(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q, err := queue.Open(ctx, nc, queue.Config{}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	return nc, q
}

// runWriter runs an event writer on q until the test ends.
func runWriter(t *testing.T, q *queue.Queue, reg prometheus.Registerer) *record.Writer {
	t.Helper()
	w := q.NewEventWriter("test", 0, reg, zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx, time.Second) }()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

// Events recorded are written in the order recorded, a WriteNow after the events before
// it, and read back as the request's status.
func TestEventWriterKeepsOrder(t *testing.T) {
	t.Parallel()
	srv := queuetest.Server(t)
	nc := queuetest.Conn(t, srv)
	q, err := queue.Open(context.Background(), nc, queue.Config{}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	w := runWriter(t, q, nil)
	id := request.NewID(time.Now())
	t0 := time.Now()
	ev := func(typ request.EventType, attempt int) request.Event {
		return request.Event{Type: typ, ID: id, ClientID: "a.b *>", Attempt: attempt, At: t0.Add(time.Duration(len(typ)+attempt) * time.Millisecond)}
	}
	for a := 1; a <= 3; a++ {
		w.Record(ev(request.EventAttemptStarted, a))
		w.Record(ev(request.EventAttemptFailed, a))
	}
	w.Record(ev(request.EventAttemptStarted, 4))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w.WriteNow(ctx, ev(request.EventDelivered, 4))
	w.Record(request.Event{Type: request.EventAttemptStarted, ID: "not-an-id", ClientID: "x"}) // never a subject
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	js, _ := jetstream.New(nc)
	stream, err := js.Stream(ctx, queue.EventStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil || info.State.Msgs != 8 {
		t.Fatalf("events stream holds %+v (%v), want the 8 events of one request", info.State, err)
	}
	var got []string
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m.Subject[len(request.EventPrefix):])
	}
	token := request.EncodeClientID("a.b *>")
	var want []string
	for a := 1; a <= 3; a++ {
		want = append(want, token+".attempt_started", token+".attempt_failed")
	}
	want = append(want, token+".attempt_started", token+".delivered")
	if !slices.Equal(got, want) {
		t.Fatalf("stored\n%v\nwant\n%v", got, want)
	}
	st, err := q.Status(ctx, "a.b *>", id)
	if err != nil || st.State != request.StateDelivered || st.Attempts != 4 || st.ClientID != "a.b *>" {
		t.Fatalf("status: %+v %v, want delivered after 4 attempts", st, err)
	}
	if st, err := q.Status(ctx, "a.b *>", request.NewID(time.Now())); err != nil || st.State != request.StateUnknown {
		t.Fatalf("status of an id without events: %+v %v, want unknown", st, err)
	}
	if _, err := q.Status(ctx, "a.b *>", "a.*"); err == nil {
		t.Fatal("status of a malformed id: no error")
	}
}

// An event whose write fails is retried until it lands: here the events stream is gone
// for a while (deleted), and the events recorded meanwhile are written once it is back.
func TestEventWriterRetriesUntilWritten(t *testing.T) {
	t.Parallel()
	nc, q := openOnServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg := prometheus.NewRegistry()
	w := runWriter(t, q, reg)
	js, _ := jetstream.New(nc)
	if err := js.DeleteStream(ctx, queue.EventStream); err != nil {
		t.Fatal(err)
	}
	id := request.NewID(time.Now())
	w.Record(request.Event{Type: request.EventAttemptStarted, ID: id, ClientID: "c"})
	done := make(chan struct{})
	go func() {
		defer close(done)
		wctx, wcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer wcancel()
		w.WriteNow(wctx, request.Event{Type: request.EventDelivered, ID: id, ClientID: "c", Attempt: 1})
	}()
	<-done // WriteNow gave up waiting; the event stays queued
	deadline := time.Now().Add(10 * time.Second)
	for counter(t, reg, "dispatch_events_retried_total") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no write was retried while the stream was gone")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := queue.Open(ctx, nc, queue.Config{}, queue.CreateOrUpdate); err != nil { // the stream is back
		t.Fatal(err)
	}
	if err := w.Flush(ctx); err != nil {
		t.Fatalf("events not written after the stream came back: %v", err)
	}
	st, err := q.Status(ctx, "c", id)
	if err != nil || st.State != request.StateDelivered {
		t.Fatalf("status: %+v %v, want delivered", st, err)
	}
}

// counter reads a counter's value from reg.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("%s is not registered", name)
	return 0
}

// A writer stopped with events waiting writes them all within its grace: a dispatcher or
// ingest shutting down behind on its events loses none.
func TestEventWriterFlushesWhenStopped(t *testing.T) {
	t.Parallel()
	srv := queuetest.Server(t)
	nc := queuetest.Conn(t, srv)
	ctx := context.Background()
	q, err := queue.Open(ctx, nc, queue.Config{}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	w := q.NewEventWriter("test", 0, nil, zerolog.Nop())
	const n = 5_000 // more than two of the writer's batches (2,048 events)
	for range n {
		w.Record(request.Event{Type: request.EventAttemptStarted, ID: request.NewID(time.Now()), ClientID: "c"})
	}
	runCtx, stop := context.WithCancel(ctx)
	stop() // stopped before it wrote anything
	// The grace is what a loaded machine may need; the flush ends as soon as all is
	// written, and the test is of what was written, not how soon.
	start := time.Now()
	w.Run(runCtx, time.Minute)
	t.Logf("the flush of %d events took %s", n, time.Since(start))
	js, _ := jetstream.New(nc)
	stream, err := js.Stream(ctx, queue.EventStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil || info.State.Msgs != n {
		t.Fatalf("events stream holds %d (%v), want the %d recorded before the stop", info.State.Msgs, err, n)
	}
}

// A status read costs kilobytes, not the 512 KiB of a SubscribeSync's 65,536-slot
// channel (issue 35, finding 3: 200 keep-alive readers took an ingest from 23 MB to
// 381 MB). Measured as bytes allocated per read, over reads of a request with events and
// of one without: a count of the reads' own allocations, not a time.
func TestEventReadsCostKilobytes(t *testing.T) {
	// Not parallel: the count is of the whole process's allocations, and the parallel
	// tests wait while this one runs.
	_, q := openOnServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w := runWriter(t, q, nil)
	id := request.NewID(time.Now())
	w.Record(request.Event{Type: request.EventAttemptStarted, ID: id, ClientID: "bob", At: time.Now()})
	w.WriteNow(ctx, request.Event{Type: request.EventDelivered, ID: id, ClientID: "bob", Attempt: 1, At: time.Now()})
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	missing := request.NewID(time.Now())
	const reads = 50
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range reads {
		for _, read := range []string{id, missing} {
			if _, err := q.StatusEvents(ctx, "bob", read); err != nil {
				t.Fatal(err)
			}
		}
	}
	runtime.ReadMemStats(&after)
	// Other goroutines (the server's, the writer's) allocate too, and the server is in
	// this process: each direct get's messages are counted on both sides. A read is
	// several direct gets since ADR 10 (a literal subject each: 2 for a delivered request,
	// 16 for an id without any, read again from further back): the bound is far
	// below 512 KiB, the issue-35 figure it guards, and was 64 KiB for ADR 8's single get.
	perRead := (after.TotalAlloc - before.TotalAlloc) / (2 * reads)
	t.Logf("%d bytes allocated per status read", perRead)
	if perRead > 128<<10 {
		t.Errorf("a status read allocates %d bytes, want tens of kilobytes", perRead)
	}
}

// A queue whose NATS user may not read queued bodies (ingest's) never asks for the head
// and says a request is at the head only when it is its client's only one: never true of
// one with a request before it.
func TestPlaceWithoutBodyReads(t *testing.T) {
	t.Parallel()
	nc := queuetest.Conn(t, queuetest.Server(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q, err := queue.Open(ctx, nc, queue.Config{NoBodyReads: true}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	place := func(r request.Receipt) *request.QueuePlace {
		return q.Place(ctx, request.Status{ID: "x", State: request.StateQueued, ClientID: "bob", Seq: r.Seq})
	}
	first, err := q.Publish(ctx, request.Request{ID: request.NewID(time.Now()), ClientID: "bob", Body: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	if p := place(first); p == nil || p.Backlog != 1 || !p.AtHead {
		t.Fatalf("bob's only request: %+v, want backlog 1 at the head", p)
	}
	second, err := q.Publish(ctx, request.Request{ID: request.NewID(time.Now()), ClientID: "bob", Body: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	if p := place(second); p == nil || p.Backlog != 2 || p.AtHead {
		t.Fatalf("bob's second request: %+v, want backlog 2 and not said at the head", p)
	}
}
