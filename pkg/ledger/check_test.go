package ledger

import (
	"strings"
	"testing"
	"time"
)

// These tests feed the checker records that break each guarantee, so a test that passes
// through Check is known to be able to fail.

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(client, id string, ms int, status int) Arrival {
	start := t0.Add(time.Duration(ms) * time.Millisecond)
	return Arrival{ClientID: client, ID: id, Start: start, End: start.Add(time.Millisecond), Status: status, StatusSent: true}
}

func check(arrivals []Arrival, accepted []Accepted, dead map[string]bool) Report {
	l := New(Options{})
	l.arrivals = arrivals
	return l.Check(Expect{Interval: 100 * time.Millisecond, Accepted: accepted, Dead: dead})
}

func acc(pairs ...string) []Accepted {
	var out []Accepted
	for i := 0; i < len(pairs); i += 2 {
		out = append(out, Accepted{ClientID: pairs[i], ID: pairs[i+1]})
	}
	return out
}

func wantViolation(t testing.TB, r Report, substr string) {
	t.Helper()
	for _, v := range r.Violations {
		if strings.Contains(v, substr) {
			return
		}
	}
	t.Fatalf("no violation containing %q in %v", substr, r.Violations)
}

func TestCheckClean(t *testing.T) {
	r := check([]Arrival{at("a", "1", 0, 200), at("a", "2", 101, 503), at("a", "2", 300, 200), at("b", "3", 50, 400)},
		acc("a", "1", "a", "2", "b", "3"), map[string]bool{"3": true})
	if len(r.Violations) != 0 || r.Delivered != 2 || r.Dead != 1 || r.Duplicates != 0 || r.MinGap != 101*time.Millisecond {
		t.Fatalf("clean record reported %v: %v", r, r.Violations)
	}
}

func TestCheckCatchesLoss(t *testing.T) {
	wantViolation(t, check([]Arrival{at("a", "1", 0, 200)}, acc("a", "1", "a", "2"), nil), "neither delivered nor dead-lettered")
}

func TestCheckCatchesGap(t *testing.T) {
	wantViolation(t, check([]Arrival{at("a", "1", 0, 200), at("a", "2", 99, 200)}, acc("a", "1", "a", "2"), nil), "below the interval")
}

func TestCheckCatchesGapFromEnd(t *testing.T) {
	a1 := at("a", "1", 0, 200)
	a1.End = a1.Start.Add(50 * time.Millisecond)
	wantViolation(t, check([]Arrival{a1, at("a", "2", 120, 200)}, acc("a", "1", "a", "2"), nil), "after the previous attempt ended")
}

func TestCheckCatchesOrder(t *testing.T) {
	wantViolation(t, check([]Arrival{at("a", "2", 0, 200), at("a", "1", 200, 200)}, acc("a", "1", "a", "2"), nil), "attempted")
}

func TestCheckCatchesSkipAfterFailure(t *testing.T) {
	// 1 failed and was neither delivered nor dead-lettered when 2 went.
	wantViolation(t, check([]Arrival{at("a", "1", 0, 503), at("a", "2", 200, 200)}, acc("a", "1", "a", "2"), nil), "before 1 was delivered")
}

func TestCheckCountsDuplicates(t *testing.T) {
	r := check([]Arrival{at("a", "1", 0, 200), at("a", "1", 200, 200)}, acc("a", "1"), nil)
	if r.Duplicates != 1 || len(r.Violations) != 0 {
		t.Fatalf("report %v %v, want one duplicate and no violation", r, r.Violations)
	}
}

func TestCheckCatchesUnknownAndDoubleOutcome(t *testing.T) {
	wantViolation(t, check([]Arrival{at("a", "x", 0, 200)}, nil, nil), "never accepted")
	wantViolation(t, check([]Arrival{at("a", "1", 0, 200)}, acc("a", "1"), map[string]bool{"1": true}), "both delivered and dead-lettered")
}

func TestCheckAllowsUnacknowledgedWhenAsked(t *testing.T) {
	l := New(Options{})
	l.arrivals = []Arrival{at("a", "x", 0, 200)}
	r := l.Check(Expect{Interval: 100 * time.Millisecond, AllowUnacknowledged: true})
	if len(r.Violations) != 0 || r.Unacknowledged != 1 {
		t.Fatalf("report %v %v, want one unacknowledged arrival and no violation", r, r.Violations)
	}
}

func TestCheckCatchesTwoInFlight(t *testing.T) {
	a1 := at("a", "1", 0, 200)
	a1.End = a1.Start.Add(300 * time.Millisecond)
	r := check([]Arrival{a1, at("a", "2", 150, 200)}, acc("a", "1", "a", "2"), nil)
	wantViolation(t, r, "in flight")
	if r.MaxInFlight != 2 {
		t.Fatalf("MaxInFlight %d, want 2", r.MaxInFlight)
	}
	if clean := check([]Arrival{at("a", "1", 0, 200), at("a", "2", 101, 200)}, acc("a", "1", "a", "2"), nil); clean.MaxInFlight != 1 {
		t.Fatalf("MaxInFlight %d for attempts one after the other, want 1", clean.MaxInFlight)
	}
}

func TestCheckMeasuresFromADroppedConnection(t *testing.T) {
	// Raven dropped the connection at 100 ms; the retry came 60 ms later.
	a1 := at("a", "1", 0, 200)
	a1.End, a1.Fault, a1.StatusSent = a1.Start.Add(100*time.Millisecond), Drop, false
	wantViolation(t, check([]Arrival{a1, at("a", "1", 160, 200)}, acc("a", "1"), nil), "after the previous attempt ended")
}

func TestCheckCatchesAnAttemptSentTwice(t *testing.T) {
	a1, a2 := at("a", "1", 0, 503), at("a", "1", 200, 200)
	a1.Attempt, a2.Attempt = 2, 2
	l := New(Options{})
	l.arrivals = []Arrival{a1, a2}
	r := l.Check(Expect{Interval: 100 * time.Millisecond, Accepted: acc("a", "1"), AttemptsOnce: true})
	wantViolation(t, r, "more than once")
}

func TestCheckCatchesAnUnexplainedDuplicate(t *testing.T) {
	l := New(Options{})
	l.arrivals = []Arrival{at("a", "1", 0, 200), at("a", "1", 200, 200), at("a", "2", 400, 200), at("a", "2", 600, 200)}
	r := l.Check(Expect{Interval: 100 * time.Millisecond, Accepted: acc("a", "1", "a", "2"), Explained: map[string]bool{"1": true}})
	wantViolation(t, r, "2 delivered again")
	if len(r.Violations) != 1 || r.Duplicates != 2 || len(r.DuplicateIDs) != 2 {
		t.Fatalf("report %v %v: want two duplicates, one explained", r, r.Violations)
	}
}

// An attempt its sender reported timed out ended, for the sender, at the timeout: raven
// answering later (here 60 ms after, the retry coming 50 ms after raven's end) is no gap
// below the interval, while the start-to-start gap is still checked. Without the report
// the same record is a violation.
func TestCheckMeasuresATimedOutAttemptFromItsStart(t *testing.T) {
	a1 := at("a", "1", 0, 503)
	a1.Attempt, a1.End = 1, a1.Start.Add(150*time.Millisecond) // the sender gave up at 90 ms
	retry := at("a", "1", 200, 200)
	retry.Attempt = 2
	l := New(Options{})
	l.arrivals = []Arrival{a1, retry}
	timedOut := map[string]bool{TimedOutKey("1", 1): true}
	if r := l.Check(Expect{Interval: 100 * time.Millisecond, Accepted: acc("a", "1"), TimedOut: timedOut}); len(r.Violations) != 0 {
		t.Fatalf("a retry an interval after the sender's timeout: %v", r.Violations)
	}
	wantViolation(t, l.Check(Expect{Interval: 100 * time.Millisecond, Accepted: acc("a", "1")}), "after the previous attempt ended")
	early := at("a", "1", 80, 200)
	early.Attempt = 2
	l.arrivals = []Arrival{a1, early}
	wantViolation(t, l.Check(Expect{Interval: 100 * time.Millisecond, Accepted: acc("a", "1"), TimedOut: timedOut}), "below the interval")
}
