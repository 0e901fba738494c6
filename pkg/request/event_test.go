package request_test

import (
	"slices"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// A request's status follows from its events whatever order they landed in: the latest
// cycle counts, a final event wins within it, else the latest attempt event.
func TestStatusOf(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	ev := func(typ request.EventType, s, cycle, attempt int) request.Event {
		return request.Event{Type: typ, ID: "r1", ClientID: "alice", At: at(s), Cycle: cycle, Attempt: attempt, Seq: uint64(10 + cycle)}
	}
	accepted := ev(request.EventAccepted, 0, 0, 0)
	accepted.AcceptedAt = at(0)
	started1, failed1 := ev(request.EventAttemptStarted, 1, 0, 1), ev(request.EventAttemptFailed, 2, 0, 1)
	failed1.Status = 503
	started2 := ev(request.EventAttemptStarted, 7, 0, 2)
	dead := ev(request.EventDeadLettered, 8, 0, 2)
	dead.Reason, dead.Status = request.ReasonPermanent, 400
	replayed := ev(request.EventReplayed, 20, 1, 0)
	delivered := ev(request.EventDelivered, 26, 1, 1)
	delivered.Status = 201
	delivered0 := ev(request.EventDelivered, 5, 0, 1)
	reaccepted := ev(request.EventAccepted, 200, 0, 0)
	withSeq := func(e request.Event, seq uint64) request.Event { e.Seq = seq; return e }
	withReason := func(e request.Event, r request.Reason) request.Event { e.Reason = r; return e }

	for _, tc := range []struct {
		name   string
		events []request.Event
		want   request.State
		check  func(t *testing.T, st request.Status)
	}{
		{"None", nil, request.StateUnknown, nil},
		{"Accepted", []request.Event{accepted}, request.StateQueued, func(t *testing.T, st request.Status) {
			if st.Seq != 10 || st.ClientID != "alice" || !st.AcceptedAt.Equal(at(0)) || st.Attempts != 0 {
				t.Errorf("%+v, want seq 10, alice, accepted at t0, no attempts", st)
			}
		}},
		{"InFlight", []request.Event{accepted, started1}, request.StateInFlight, nil},
		// The accepted event, written by ingest, landed after the dispatcher's first.
		{"AcceptedLate", []request.Event{started1, accepted}, request.StateInFlight, nil},
		{"Retrying", []request.Event{accepted, started1, failed1}, request.StateQueued, func(t *testing.T, st request.Status) {
			if st.Attempts != 1 || st.LastAttempt == nil || st.LastAttempt.Status != 503 {
				t.Errorf("%+v, want 1 attempt, the last answered 503", st)
			}
		}},
		{"SecondAttempt", []request.Event{accepted, failed1, started2}, request.StateInFlight, nil},
		{"DeadLettered", []request.Event{accepted, started2, failed1, dead}, request.StateDeadLettered, func(t *testing.T, st request.Status) {
			if st.DeadLetter == nil || st.DeadLetter.Reason != request.ReasonPermanent || st.DeadLetter.LastStatus != 400 || !st.DeadLetter.Replayable || st.Seq != 0 {
				t.Errorf("%+v, want dead-lettered as permanent, last 400, replayable", st)
			}
			// The attempt that dead-lettered it is the last (it was the one before it,
			// or the last one's start without its answer: found by a hostile-raven pass).
			if la := st.LastAttempt; la == nil || la.Status != 400 || !la.At.Equal(at(8)) || st.Attempts != 2 {
				t.Errorf("last attempt %+v of %d, want the dead-lettering one: 400 at +8s, of 2", la, st.Attempts)
			}
		}},
		// An expired request's dead letter counts its earlier attempt, but no attempt
		// decided it: its last attempt is the one that failed.
		{"ExpiredAfterAFailure", []request.Event{accepted, started1, failed1, withReason(ev(request.EventDeadLettered, 3600, 0, 1), request.ReasonExpired)}, request.StateDeadLettered, func(t *testing.T, st request.Status) {
			if la := st.LastAttempt; la == nil || la.Status != 503 || !la.At.Equal(at(2)) {
				t.Errorf("last attempt %+v, want the failed one: 503 at +2s", la)
			}
		}},
		// A non-final event retried and landing after the final one does not undo it.
		{"FinalWins", []request.Event{accepted, dead, started2}, request.StateDeadLettered, nil},
		{"Replayed", []request.Event{accepted, dead, replayed}, request.StateQueued, func(t *testing.T, st request.Status) {
			if st.Replays != 1 || st.Seq != 11 || st.DeadLetter != nil || !st.AcceptedAt.Equal(at(0)) {
				t.Errorf("%+v, want queued after 1 replay at seq 11, accepted at t0", st)
			}
		}},
		// The same Idempotency-Key sent again after the duplicate window: a new request
		// with the same id, stored at a later sequence. The earlier one's delivery is not
		// the new one's.
		{"KeyReusedAfterWindow", []request.Event{accepted, withSeq(delivered0, 10), withSeq(reaccepted, 30)}, request.StateQueued, func(t *testing.T, st request.Status) {
			if st.Seq != 30 || st.DeliveredAt != (time.Time{}) {
				t.Errorf("%+v, want queued at seq 30, not delivered", st)
			}
		}},
		// Events written before events carried their sequence count with any.
		{"EventWithoutSeq", []request.Event{accepted, withSeq(delivered0, 0)}, request.StateDelivered, nil},
		{"DeliveredAfterReplay", []request.Event{delivered, replayed, dead, accepted}, request.StateDelivered, func(t *testing.T, st request.Status) {
			if st.RavenStatus != 201 || !st.DeliveredAt.Equal(at(26)) || st.Attempts != 1 || !st.Final() {
				t.Errorf("%+v, want delivered at +26s with 201 on attempt 1", st)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := request.StatusOf("r1", slices.Clone(tc.events))
			if st.State != tc.want || st.ID != "r1" {
				t.Fatalf("status %q (%+v), want %q", st.State, st, tc.want)
			}
			if tc.check != nil {
				tc.check(t, st)
			}
		})
	}
}

func TestValidateID(t *testing.T) {
	good := []string{request.NewID(time.Now()), request.IDFromKey("", "alice", "k1")}
	for _, id := range good {
		if err := request.ValidateID(id); err != nil {
			t.Errorf("%q: %v", id, err)
		}
	}
	for _, id := range []string{"", "d1", "*", ">", "a.b", "0123456789abcdefghjkmnpqr*", "0123456789abcdefghjkmnpqrsu", "K0123456789abcdefghjkmnpqrs", "0123456789abcdefghjkmnpqrs.x"} {
		if request.ValidateID(id) == nil {
			t.Errorf("%q: accepted, want refused", id)
		}
	}
}
