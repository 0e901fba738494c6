package integration

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// G10 across a crash while the events stream refuses writes (issue 34): the dispatcher
// process delivers a request, removes it and is killed with SIGKILL before the events
// stream takes its delivered event. The event was kept in the request stream before the
// removal, so once the events stream takes writes again the next dispatcher writes it and
// the status says delivered. Before, the event lived only in the killed process's memory:
// the status said queued for the whole retention.
func TestFinalEventSurvivesACrashWhileEventsAreRefused(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{interval: 200 * time.Millisecond, noStart: true})
	env := map[string]string{"NATS_URL": s.srv.ClientURL(), "RAVEN_URL": s.ravenURL, "DISPATCH_INTERVAL": "200ms",
		"LEASE_TTL": "6s", "RAVEN_TIMEOUT": "3s"}
	p := startProc(t, env)
	// The dispatcher brings the streams' settings in line when it starts: refuse event
	// writes only once it delivered a first request (it is running, the streams opened).
	s.post("warm", 0)
	waitFor(t, 2*time.Minute, "the first request delivered", func() bool { return s.ledger.Delivered() == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	js, err := jetstream.New(s.nc)
	if err != nil {
		t.Fatal(err)
	}
	events, err := js.Stream(ctx, queue.EventStream)
	if err != nil {
		t.Fatal(err)
	}
	open := events.CachedInfo().Config
	closed := open
	closed.Discard, closed.MaxMsgs = jetstream.DiscardNew, int64(events.CachedInfo().State.Msgs)
	if _, err := js.UpdateStream(ctx, closed); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, request.EventPrefix+"probe", nil); err == nil {
		t.Fatal("the events stream still takes writes; the test cannot refuse them this way")
	}

	id := s.post("ada", 0)
	waitFor(t, 2*time.Minute, "ada's request delivered and removed", func() bool {
		return s.ledger.Delivered() == 2 && s.queued() == 0
	})
	p.signal(syscall.SIGKILL)

	if st, err := s.q.Status(ctx, "ada", id); err != nil || st.State == request.StateDelivered {
		t.Fatalf("status %+v (%v) while the events stream refuses writes; the test did not refuse them", st, err)
	}
	if n := queuetest.KeptOutcomes(t, s.nc); n != 1 {
		t.Fatalf("%d final events kept in the request stream after the removal, want ada's: the kill lost it", n)
	}

	if _, err := js.UpdateStream(ctx, open); err != nil {
		t.Fatal(err)
	}
	p2 := startProc(t, env)
	waitFor(t, time.Minute, "ada's status delivered after the restart", func() bool {
		st, err := s.q.Status(ctx, "ada", id)
		return err == nil && st.State == request.StateDelivered
	})
	// The drain writes a kept event, then removes it: the status can read delivered a
	// moment before the removal.
	waitFor(t, 30*time.Second, "the kept final event removed once written", func() bool {
		return queuetest.KeptOutcomes(t, s.nc) == 0
	})
	p2.signal(syscall.SIGTERM)
	s.check(0)
}
