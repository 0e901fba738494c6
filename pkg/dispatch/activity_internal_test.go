package dispatch

import (
	"fmt"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

func TestHistoryKeepsEachClientsLastAttemptsInOrder(t *testing.T) {
	t.Parallel()
	a := newActivity(2)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range HistoryPerClient + 5 {
		at := t0.Add(time.Duration(i) * time.Second)
		a.attempt(request.Lane{Token: "a"}, introspect.Attempt{ID: fmt.Sprint(i), Start: at, End: at, Outcome: schedule.OutcomeDelivered, Status: 200})
	}
	h := a.history(request.Lane{Token: "a"})
	if len(h) != HistoryPerClient || h[0].ID != "5" || h[len(h)-1].ID != fmt.Sprint(HistoryPerClient+4) {
		t.Fatalf("history of %d from %s to %s; want the last %d, oldest first", len(h), h[0].ID, h[len(h)-1].ID, HistoryPerClient)
	}
	kept := introspect.Attempt{ID: "k", Attempt: 3, Start: t0, End: t0.Add(time.Millisecond), Gap: 5*time.Second + 1234, HasGap: true,
		Interval: 5 * time.Second, Outcome: schedule.OutcomeTransient, Status: 503}
	a.attempt(request.Lane{Token: "k"}, kept)
	a.attempt(request.Lane{Token: "k"}, introspect.Attempt{ID: "k2", Start: t0, End: t0, Outcome: schedule.OutcomePermanent})
	if h := a.history(request.Lane{Token: "k"}); len(h) != 2 || !h[0].Start.Equal(kept.Start) || !h[0].End.Equal(kept.End) ||
		h[0].ID != kept.ID || h[0].Attempt != 3 || h[0].Gap != kept.Gap || !h[0].HasGap || h[0].Interval != kept.Interval ||
		h[0].Outcome != kept.Outcome || h[0].Status != 503 || h[1].HasGap || h[1].Outcome != schedule.OutcomePermanent {
		t.Fatalf("history of k: %+v; want %+v kept as it was, then k2", h, kept)
	}
	a = newActivity(2)
	a.attempt(request.Lane{Token: "a"}, introspect.Attempt{ID: "a1", Start: t0, End: t0})
	a.attempt(request.Lane{Token: "b"}, introspect.Attempt{ID: "b1", Start: t0, End: t0})
	a.attempt(request.Lane{Token: "a"}, introspect.Attempt{ID: "a-again", Start: t0, End: t0}) // a is now the most recent
	a.attempt(request.Lane{Token: "c"}, introspect.Attempt{ID: "c1", Start: t0, End: t0})      // evicts b, the least recent
	if a.history(request.Lane{Token: "b"}) != nil || a.history(request.Lane{Token: "a"}) == nil || a.history(request.Lane{Token: "c"}) == nil {
		t.Fatalf("after c: b %v, a %d, c %d; want b evicted", a.history(request.Lane{Token: "b"}), len(a.history(request.Lane{Token: "a"})), len(a.history(request.Lane{Token: "c"})))
	}
}

func TestActivityCountsTheLastMinuteOnly(t *testing.T) {
	t.Parallel()
	a := newActivity(0)
	now := time.Date(2026, 1, 1, 0, 10, 0, 0, time.UTC)
	old := now.Add(-2 * introspect.ActivityWindow)
	a.attempt(request.Lane{Token: "x"}, introspect.Attempt{Start: old, End: old, Outcome: schedule.OutcomeTransient})
	a.deadLettered("permanent_failure", old)
	for i, took := range []time.Duration{time.Millisecond, 3 * time.Millisecond, 40 * time.Millisecond, time.Minute} {
		end := now.Add(-time.Duration(i) * 10 * time.Second)
		status, outcome := 200, schedule.OutcomeDelivered
		if i == 3 {
			status, outcome = 0, schedule.OutcomeTransient
		}
		a.attempt(request.Lane{Token: "x"}, introspect.Attempt{Start: end.Add(-took), End: end, Outcome: outcome, Status: status})
	}
	a.deadLettered("max_attempts", now)
	w := a.window(now)
	if w.Outcomes[schedule.OutcomeDelivered] != 3 || w.Outcomes[schedule.OutcomeTransient] != 1 || w.Statuses["200"] != 3 || w.Statuses["error"] != 1 {
		t.Fatalf("outcomes %v, statuses %v; want 3 delivered (200) and 1 transient (error), the older ones left out", w.Outcomes, w.Statuses)
	}
	if len(w.DeadLetters) != 1 || w.DeadLetters["max_attempts"] != 1 {
		t.Fatalf("dead letters %v; want max_attempts 1 only", w.DeadLetters)
	}
	if q := w.Quantile(0.5); q != 5*time.Millisecond {
		t.Fatalf("p50 %s; want the 5ms bucket (answers of 1, 3, 40 ms and 1 min)", q)
	}
	if q := w.Quantile(0.99); q != -1 {
		t.Fatalf("p99 %s; want -1, past the last bound", q)
	}
	// now starts a slot: the counts cover eleven whole slots, not a whole minute, and a
	// rate must divide by that. A second later, by a second more.
	if w.Window != 55*time.Second {
		t.Fatalf("window %s at the start of a slot; want 55s", w.Window)
	}
	if w := a.window(now.Add(time.Second)); w.Window != 56*time.Second {
		t.Fatalf("window %s a second into a slot; want 56s", w.Window)
	}
	one := newActivity(1)
	one.attempt(request.Lane{Token: "y"}, introspect.Attempt{Start: now, End: now, Outcome: "something new"})
	if h := one.history(request.Lane{Token: "y"}); len(h) != 1 || h[0].Outcome != "unknown" {
		t.Fatalf("an outcome the history does not know is shown as %+v, want unknown", h)
	}
	var all introspect.Activity
	all.Merge(w)
	all.Merge(w)
	if all.Outcomes[schedule.OutcomeDelivered] != 6 || all.Latency[0] != 2 || all.Window != w.Window {
		t.Fatalf("merged twice: %v, latency %v", all.Outcomes, all.Latency)
	}
}

// BenchmarkActivityAttempt is what remembering one attempt costs the send path (run by
// hand: go test -run '^$' -bench Activity ./pkg/dispatch).
func BenchmarkActivityAttempt(b *testing.B) {
	a := newActivity(DefaultAttemptHistory)
	lanes := make([]request.Lane, 20_000)
	for i := range lanes {
		lanes[i] = request.Lane{Partition: i % 64, Token: fmt.Sprintf("client-%d", i)}
	}
	now := time.Now()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		a.attempt(lanes[i%len(lanes)], introspect.Attempt{ID: "r", Start: now, End: now, Outcome: schedule.OutcomeDelivered, Status: 200, HasGap: true})
		i++
	}
}
