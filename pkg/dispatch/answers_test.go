package dispatch

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// The dispatcher answers each of the operators' questions, from its loop's lanes and from
// what it remembers; a subject that names no lane is answered as one it holds no lane for.
func TestDispatcherAnswersEachQuestion(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, Config{Policy: schedule.Policy{Interval: time.Second}})
		l := newTestLoop(t, b)
		ownAll(b, l)
		queue(b, l, []string{"alice", "bob"}, 2)
		b.clock.advance(time.Second) // the fence
		drive(t, b, l, 500*time.Millisecond, 10*time.Millisecond)
		// The loop answers its part of a question in its own goroutine.
		loopAnswers := func(ask func() ([]schedule.LaneInfo, error)) []schedule.LaneInfo {
			done := make(chan []schedule.LaneInfo, 1)
			go func() {
				lanes, err := ask()
				if err != nil {
					t.Error(err)
				}
				done <- lanes
			}()
			for {
				select {
				case q := <-b.d.queries:
					q.reply <- l.lanesOf(q)
				case lanes := <-done:
					return lanes
				}
			}
		}
		lanes := func(q introspect.LanesQuestion) []schedule.LaneInfo {
			return loopAnswers(func() ([]schedule.LaneInfo, error) { return b.d.AnswerLanes(context.Background(), q) })
		}
		alice := laneOf(0, "alice").Subject()
		got := lanes(introspect.LanesQuestion{Subjects: []string{alice, "nope", "dispatch.requests.x.y"}})
		if len(got) != 1 || got[0].Subject != alice || got[0].LastDelivered.IsZero() || got[0].State != schedule.LaneWaiting {
			t.Errorf("alice's lane and two subjects that name none: %+v", got)
		}
		if got := lanes(introspect.LanesQuestion{Subjects: []string{"nope"}}); len(got) != 0 {
			t.Errorf("a subject that names no lane: %+v", got)
		}
		if got := lanes(introspect.LanesQuestion{}); len(got) != 2 {
			t.Errorf("every lane: %d, want 2", len(got))
		}
		if got := lanes(introspect.LanesQuestion{Limit: 1}); len(got) != 1 {
			t.Errorf("up to one lane: %d", len(got))
		}
		due := loopAnswers(func() ([]schedule.LaneInfo, error) {
			return b.d.AnswerDueLanes(context.Background(), introspect.DueLanesQuestion{Limit: 5})
		})
		if len(due) != 2 || due[0].NextSend.After(due[1].NextSend) {
			t.Errorf("due lanes: %+v, want both, the earliest first", due)
		}
		if got := b.d.AnswerDelivered(introspect.DeliveredQuestion{IDs: []string{"alice-0", "zed"}}); len(got) != 1 || got[0].ID != "alice-0" || got[0].Subject != alice {
			t.Errorf("delivered: %+v, want alice-0 alone", got)
		}
		h := b.d.AnswerHistory(introspect.HistoryQuestion{Subjects: []string{alice, "nope"}})
		if len(h) != 1 || len(h[alice]) != 1 || h[alice][0].ID != "alice-0" || h[alice][0].Instance != b.d.Instance() {
			t.Errorf("history: %+v, want alice's one attempt, with this instance", h)
		}
		st := b.d.Stats() // what the running loop publishes; the test's loop does not
		if act := b.d.AnswerActivity(); act.Outcomes[schedule.OutcomeDelivered] != 2 || act.Owned != st.Owned || act.Lanes != st.Lanes || act.InFlight != st.InFlight {
			t.Errorf("activity: %+v, want 2 deliveries, and the loop's counts %+v", act, st)
		}
		if bs := b.d.AnswerBudget(); bs.Owned != b.src.Partitions() {
			t.Errorf("budget: %+v, want every partition owned", bs)
		}
	})
}
