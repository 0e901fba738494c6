package queue_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// Raven's budget in the control bucket: set field by field, read back, heard by the
// watch, cleared back to the configured one; a value that cannot work is refused, and a
// record written by hand that cannot work is skipped by the watch (and said so).
func TestControlBudget(t *testing.T) {
	t.Parallel()
	s := queuetest.Server(t)
	nc := queuetest.Conn(t, s)
	ctx := context.Background()
	q, err := queue.Open(ctx, nc, queue.Config{}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	ctl, err := q.Control(ctx, zerolog.New(&logged))
	if err != nil {
		t.Fatal(err)
	}
	rate := 250.0
	if _, err := ctl.UpdateBudget(ctx, "test", func(b *request.Budget) { b.MaxRate = &rate }); err != nil {
		t.Fatal(err)
	}
	events := make(chan request.SteerChange, 16)
	cur, stop, err := ctl.WatchSteering(ctx, func(e request.SteerChange) { events <- e })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if len(cur) != 1 || cur[0].Budget == nil || *cur[0].Budget.MaxRate != 250 || cur[0].Budget.MaxInFlight != nil {
		t.Fatalf("watch began with %+v, want the budget record with rate 250 only", cur)
	}
	for _, bad := range []float64{-1, 1e-9, 2e6} {
		if _, err := ctl.UpdateBudget(ctx, "test", func(b *request.Budget) { b.MaxRate = &bad }); err == nil {
			t.Errorf("a max rate of %v was accepted", bad)
		}
	}
	n := 8
	if _, err := ctl.UpdateBudget(ctx, "test", func(b *request.Budget) { b.MaxInFlight = &n }); err != nil {
		t.Fatal(err)
	}
	if e := nextSteer(t, events, "the budget with 8 in flight"); e.Budget == nil || *e.Budget.MaxRate != 250 || *e.Budget.MaxInFlight != 8 || e.Budget.By != "test" {
		t.Fatalf("the watch heard %+v, want rate 250 and 8 in flight, by test", e)
	}
	// By hand, a record no dispatcher could apply.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, queue.ControlBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.PutString(ctx, "budget", `{"maxRate":-5}`); err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.UpdateBudget(ctx, "test", func(b *request.Budget) { *b = request.Budget{} }); err != nil {
		t.Fatal(err)
	}
	e := nextSteer(t, events, "the cleared budget") // the bad record is skipped: the next event is the cleared one
	if e.Budget == nil || !e.Budget.IsZero() {
		t.Fatalf("after the bad record and a clear the watch heard %+v, want the budget back to the configured one", e)
	}
	if !strings.Contains(logged.String(), "max rate -5") {
		t.Fatalf("the bad record was not logged: %q", logged.String())
	}
	select { // the cleared record is written (saying by whom), then deleted
	case e := <-events:
		if e.Budget == nil || !e.Budget.IsZero() {
			t.Fatalf("unexpected event %+v", e)
		}
	case <-time.After(time.Second):
	}
	if b, err := ctl.Budget(ctx); err != nil || !b.IsZero() {
		t.Fatalf("budget after clearing: %+v %v, want none", b, err)
	}
}

// nextSteer is the watch's next event, awaited 30 s at most; what says what it should be.
func nextSteer(t testing.TB, events <-chan request.SteerChange, what string) request.SteerChange {
	t.Helper()
	select {
	case e := <-events:
		return e
	case <-time.After(30 * time.Second):
		t.Fatalf("the steering watch said nothing within 30 s; awaited: %s", what)
		return request.SteerChange{}
	}
}
