package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/ledger"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// A request that keeps failing keeps its attempt count across a dispatcher restart, on a
// real queue, record and raven: with MaxAttempts 3, two attempts before the restart and
// one after it, then dead-lettered as attempts_exhausted after 3. Before, the restarted
// dispatcher counted from one again and raven saw five attempts: a request that always
// fails held its client's queue for as long as the dispatchers kept restarting.
func TestAttemptsCountOnAcrossARestart(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{interval: 100 * time.Millisecond, policy: schedule.Policy{MaxAttempts: 3, BackoffBase: 5 * time.Second, BackoffMax: 5 * time.Second},
		respond: func(ledger.Arrival) ledger.Response { return ledger.Response{Status: 503} }})
	id := s.post("fay", 1)
	arrivals := func() []ledger.Arrival {
		var out []ledger.Arrival
		for _, a := range s.ledger.Arrivals() {
			if a.ID == id {
				out = append(out, a)
			}
		}
		return out
	}
	waitForState(t, time.Minute, "two attempts", func() (bool, string) {
		n := len(arrivals())
		return n >= 2, fmt.Sprint(n, " attempts")
	})
	s.stopDispatcher()
	if n := len(arrivals()); n != 2 {
		t.Fatalf("%d attempts before the restart, want 2 (the backoff is seconds)", n)
	}
	// Both failures recorded before the restart (the record is written in the background).
	lane, _, ok, err := s.q.ClientLane(context.Background(), "fay")
	if err != nil || !ok {
		t.Fatalf("fay's lane: %v %v", ok, err)
	}
	head, _, err := s.q.Head(context.Background(), lane)
	if err != nil || head.ID != id {
		t.Fatalf("head %s (%v), want %s", head.ID, err, id)
	}
	waitForState(t, time.Minute, "both failures in the record", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n, _, err := s.q.EarlierAttempts(ctx, head)
		return n == 2, fmt.Sprint(n, " ", err)
	})
	s.startDispatcher()
	waitForState(t, time.Minute, "the request dead-lettered", func() (bool, string) {
		d := s.deadLetters()
		return len(d) == 1, fmt.Sprint(len(d), " dead letters")
	})
	d := s.deadLetters()[0]
	if d.ID != id || d.Reason != request.ReasonAttemptsExhausted || d.Attempts != 3 {
		t.Errorf("dead letter %+v, want %s attempts_exhausted after 3", d.Verdict, id)
	}
	got := arrivals()
	if len(got) != 3 || got[2].Attempt != 3 {
		t.Errorf("raven saw %d attempts (the last numbered %d), want 3, the last numbered 3", len(got), got[len(got)-1].Attempt)
	}
	s.finish(15*time.Second, 0)
}
