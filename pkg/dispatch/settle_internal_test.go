package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/lease"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// leasesOnly is a lease store for a dispatcher whose leaser never runs: the test checks
// what it does with a lease it is told of.
type leasesOnly struct{ lease.Store }

const testTTL = 10 * time.Second

// eventDeadline records the deadline WriteNow was given.
type eventDeadline struct{ left time.Duration }

func (e *eventDeadline) Record(request.Event) {}
func (e *eventDeadline) WriteNow(ctx context.Context, _ request.Event) bool {
	d, _ := ctx.Deadline()
	e.left = time.Until(d)
	return true
}

// The wait for a delivered request's final event ends by the attempt's own deadline
// (sendBy + the send timeout): the removal that follows must land while the lease still
// holds, or the next owner sends the request again. It used to wait 2 s whatever the
// lease said.
func TestTheFinalEventsWaitEndsInsideTheLease(t *testing.T) {
	t.Parallel()
	ev := &eventDeadline{}
	b := setup(t, Config{Leases: leasesOnly{}, LeaseTTL: testTTL, SendTimeout: time.Second, Events: ev})
	sendBy := b.clock.now().Add(100 * time.Millisecond) // the attempt started near the end of the lease's window
	b.d.writeNow(context.Background(), request.Event{Type: request.EventDelivered}, sendBy)
	if ev.left > 1100*time.Millisecond+100*time.Millisecond {
		t.Fatalf("the final event may be waited for %s; the attempt's deadline is 1.1 s away (sendBy + send timeout)", ev.left)
	}
	b.d.writeNow(context.Background(), request.Event{Type: request.EventDelivered}, time.Time{})
	if ev.left < time.Second {
		t.Fatalf("without a lease the final event is waited for %s, want the 2 s of eventWait", ev.left)
	}
}
