package dispatch

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/penguinhq/dispatcher/pkg/governor"
	"github.com/penguinhq/dispatcher/pkg/lease"
	"github.com/penguinhq/dispatcher/pkg/raven"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// Unit tests of raven's budget in the loop: the loop driven by the test's clock, with
// every partition of the in-memory source owned (pkg/governor tests the governor alone).

// ownAll gives l every partition from now, leases valid for an hour.
func ownAll(b *bundle, l *loop) {
	for p := range b.src.Partitions() {
		l.ownership(lease.Event{Kind: lease.Acquired, Partition: p, ValidUntil: b.clock.now().Add(time.Hour)})
	}
}

// drive runs l by the test's clock for d in steps of step: at each step it starts what is
// due and takes back every result.
func drive(t *testing.T, b *bundle, l *loop, d, step time.Duration) {
	t.Helper()
	for end := b.clock.now().Add(d); b.clock.now().Before(end); b.clock.advance(step) {
		l.startDue()
		for l.sched.InFlight() > 0 {
			l.result(t)
		}
	}
}

// queue adds n requests for each of clients, spread over the partitions, and notifies l.
func queue(b *bundle, l *loop, clients []string, n int) {
	for i, c := range clients {
		subj := laneOf(i%b.src.Partitions(), c)
		for k := range n {
			b.src.add(subj, fmt.Sprintf("%s-%d", c, k), start)
		}
		l.notify(subj)
	}
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%03d", prefix, i)
	}
	return out
}

// A static rate holds the instance to it, whatever is due: over any stretch the
// attempts are at most rate × time plus the bucket's one token of burst.
func TestBudgetRateBindsTheLoop(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, Config{Policy: schedule.Policy{Interval: time.Second}, Budget: governor.Budget{MaxRate: 20}})
		l := newTestLoop(t, b)
		ownAll(b, l)
		queue(b, l, names("c", 200), 3)
		b.clock.advance(time.Second) // the fence
		t0 := b.clock.now()
		drive(t, b, l, 5*time.Second, 5*time.Millisecond)
		a := b.snd.attempts()
		if len(a) < 95 || len(a) > 101 {
			t.Fatalf("%d attempts in 5s under a budget of 20/s, want 100 (and at most 101)", len(a))
		}
		withinRate(t, a, 20)
		if st := b.d.BudgetState(); st.EffectiveRate != 20 || st.ShareRate != 20 || st.Owned != 4 {
			t.Fatalf("budget state %+v, want rate 20 of 20 with 4 partitions", st)
		}
		if b.d.BudgetState().Waiting == 0 {
			t.Fatal("no lanes counted as waiting for the budget while it bound")
		}
		if a[0].at.Before(t0) {
			t.Fatalf("first attempt at %s, before the fence", a[0].at.Sub(start))
		}
	})
}

// withinRate fails t if any run of attempts a is more than rate × its span plus one
// token of burst (ADR 7's bound at a rate whose burst is one token).
func withinRate(t *testing.T, a []sent, rate float64) {
	t.Helper()
	for i := range a {
		for j := i; j < len(a); j++ {
			if span := a[j].at.Sub(a[i].at); float64(j-i+1) > rate*span.Seconds()+1+1e-9 {
				t.Fatalf("attempts %d..%d (%d) within %s: more than %g/s and one burst allow", i, j, j-i+1, span, rate)
			}
		}
	}
}

// Turns that make no attempt (the client's queue turned out empty) give their token
// back: 50 clients with one request each are sent at the full rate, not half of it.
func TestBudgetTokensOfEmptyTurnsAreGivenBack(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, Config{Policy: schedule.Policy{Interval: 100 * time.Millisecond}, Budget: governor.Budget{MaxRate: 10}})
		l := newTestLoop(t, b)
		ownAll(b, l)
		queue(b, l, names("c", 50), 1)
		b.clock.advance(100 * time.Millisecond)
		drive(t, b, l, 5*time.Second, 5*time.Millisecond)
		if n := len(b.snd.attempts()); n < 49 {
			t.Fatalf("%d of 50 sent in 5s at 10/s: the empty turns after each delivery cost tokens", n)
		}
	})
}

// Fairness under a binding budget: a client with a huge backlog takes one slot per turn
// like any other (it can go no more often than its interval), and the lanes go in the
// order they became due: all 100 one-request clients are sent within 100/B plus one
// interval of the first send.
func TestBudgetIsFairToSmallClients(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const rate = 20.0
		b := setup(t, Config{Policy: schedule.Policy{Interval: time.Second}, Budget: governor.Budget{MaxRate: rate}})
		l := newTestLoop(t, b)
		ownAll(b, l)
		queue(b, l, []string{"big"}, 2000)
		b.clock.advance(100 * time.Millisecond) // the big one became due first
		queue(b, l, names("small", 100), 1)
		b.clock.advance(time.Second)
		drive(t, b, l, 10*time.Second, 5*time.Millisecond)
		a := b.snd.attempts()
		first := a[0].at
		last, big := map[string]time.Time{}, 0
		for _, s := range a {
			if strings.HasPrefix(s.id, "big-") {
				big++
				continue
			}
			last[s.id] = s.at
		}
		bound := first.Add(time.Duration(100/rate*float64(time.Second)) + time.Second)
		for _, c := range names("small", 100) {
			at, ok := last[c+"-0"]
			if !ok || at.After(bound) {
				t.Fatalf("%s sent at %v (sent: %v), want by %s after the first send", c, at.Sub(first), ok, bound.Sub(first))
			}
		}
		// The big client went first, then waited its turn behind the 100 (due before its next
		// send), then every interval: not starved, and never more often than its interval.
		if big < 5 || big > 11 {
			t.Fatalf("the big client was sent %d times in 10s at a 1s interval, want 5 to 10", big)
		}
	})
}

// An in-flight budget caps attempts in flight to the instance's share: 4 of 8 partitions
// owned gives half of it.
func TestBudgetInFlightShare(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupOn(t, 8, Config{Policy: schedule.Policy{Interval: time.Second}, Budget: governor.Budget{MaxInFlight: 6}})
		l := newTestLoop(t, b)
		for p := range 4 {
			l.ownership(lease.Event{Kind: lease.Acquired, Partition: p, ValidUntil: b.clock.now().Add(time.Hour)})
		}
		var clients []string
		for i := range 40 {
			clients = append(clients, fmt.Sprintf("c%02d", i))
		}
		for i, c := range clients {
			subj := laneOf(i%4, c)
			b.src.add(subj, c, start)
			l.notify(subj)
		}
		b.clock.advance(time.Second)
		l.startDue()
		if n := l.sched.InFlight(); n != 3 {
			t.Fatalf("%d attempts in flight, want 3 (6 × 4/8)", n)
		}
		if st := b.d.BudgetState(); st.ShareInFlight != 3 {
			t.Fatalf("share %+v, want 3 in flight", st)
		}
		l.result(t)
		l.startDue()
		if n := l.sched.InFlight(); n != 3 {
			t.Fatalf("%d in flight after one ended, want 3 again", n)
		}
	})
}

// The share follows the partitions this instance may send for: acquired, lapsed (by its
// own clock, before the store lets anyone else take it), lost.
func TestBudgetShareFollowsOwnership(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, Config{Policy: schedule.Policy{Interval: time.Second}, Budget: governor.Budget{MaxRate: 100, MaxInFlight: 40}})
		l := newTestLoop(t, b)
		now := b.clock.now()
		l.ownership(lease.Event{Kind: lease.Acquired, Partition: 0, ValidUntil: now.Add(time.Hour)})
		l.ownership(lease.Event{Kind: lease.Acquired, Partition: 1, ValidUntil: now.Add(2 * time.Second)})
		l.startDue()
		if st := b.d.BudgetState(); st.ShareRate != 50 || st.ShareInFlight != 20 || st.EffectiveRate != 50 {
			t.Fatalf("2 of 4 partitions: %+v, want 50/s and 20 in flight", st)
		}
		b.clock.advance(2 * time.Second) // partition 1's lease could lapse now: it no longer counts
		l.startDue()
		if st := b.d.BudgetState(); st.ShareRate != 25 || st.ShareInFlight != 10 || !strings.HasPrefix(st.Why, governor.WhyShare) {
			t.Fatalf("after a lease lapsed: %+v, want 25/s, 10 in flight, why share", st)
		}
		l.ownership(lease.Event{Kind: lease.Lost, Partition: 0})
		l.startDue()
		if st := b.d.BudgetState(); st.ShareRate != 0 || st.EffectiveRate != 0 || st.Owned != 0 {
			t.Fatalf("nothing owned: %+v, want no share", st)
		}
	})
}

// An operator's budget replaces the configured one field by field, and clearing it goes
// back to the configured one.
func TestBudgetSteered(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, Config{Policy: schedule.Policy{Interval: time.Second}, Budget: governor.Budget{MaxRate: 100, MaxInFlight: 8}})
		l := newTestLoop(t, b)
		ownAll(b, l)
		l.startDue()
		rate := 40.0
		l.steer(request.SteerChange{Budget: &request.Budget{MaxRate: &rate, By: "ops"}}, false)
		if st := b.d.BudgetState(); st.MaxRate != 40 || st.MaxInFlight != 8 || st.EffectiveRate != 40 || st.Steered == nil {
			t.Fatalf("steered rate: %+v, want 40/s and the configured 8 in flight", st)
		}
		if !strings.Contains(b.log.String(), "raven's budget changed") {
			t.Fatal("the change was not logged")
		}
		zero := 0
		l.steer(request.SteerChange{Budget: &request.Budget{MaxInFlight: &zero}}, false)
		if st := b.d.BudgetState(); st.MaxInFlight != 0 || st.ShareInFlight != 0 || st.MaxRate != 100 {
			t.Fatalf("steered in flight to none: %+v", st)
		}
		l.steer(request.SteerChange{Budget: &request.Budget{}}, false)
		if st := b.d.BudgetState(); st.MaxRate != 100 || st.MaxInFlight != 8 || st.Steered != nil {
			t.Fatalf("cleared: %+v, want the configured budget", st)
		}
	})
}

// A 503 with Retry-After pauses every send of the instance for that long; a 429 with
// Retry-After does not.
func TestAdaptivePausesOn503RetryAfter(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, Config{Policy: schedule.Policy{Interval: 100 * time.Millisecond}, Adaptive: governor.Adaptive{Enabled: true, Start: 1000}})
		l := newTestLoop(t, b)
		ownAll(b, l)
		queue(b, l, names("c", 20), 20)
		b.clock.advance(100 * time.Millisecond)
		b.snd.answer = func(st request.Stored, _ int) error {
			if st.ClientID == "c000" {
				return raven.Classify(429, "3", b.clock.now())
			}
			return nil
		}
		drive(t, b, l, 500*time.Millisecond, 10*time.Millisecond)
		if b.d.BudgetState().PausedUntil.After(b.clock.now()) {
			t.Fatal("a 429 with Retry-After paused every send")
		}
		if n := len(b.snd.attempts()); n < 30 {
			t.Fatalf("%d attempts in 500ms beside a client answered 429: the others were held", n)
		}
		n := len(b.snd.attempts())
		var mu sync.Mutex // the answer is given by the workers, several at once
		var pausedAt time.Time
		before := b.d.BudgetState().AdaptiveRate
		b.snd.answer = func(st request.Stored, _ int) error {
			mu.Lock()
			defer mu.Unlock()
			if pausedAt.IsZero() {
				pausedAt = b.clock.now()
				return raven.Classify(503, "2", b.clock.now())
			}
			return nil
		}
		drive(t, b, l, 3*time.Second, 10*time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		var during, after int
		for _, s := range b.snd.attempts()[n:] {
			switch {
			case s.at.Equal(pausedAt):
			case s.at.Before(pausedAt.Add(2 * time.Second)):
				during++
			default:
				after++
			}
		}
		if during != 0 || after == 0 {
			t.Fatalf("after raven's 503 Retry-After 2: %d attempts during the pause, %d after; want none, then some", during, after)
		}
		if st := b.d.BudgetState(); st.AdaptiveRate != 0 && st.AdaptiveRate < before {
			t.Fatalf("the pause also cut the rate, from %v to %v: sends would crawl after it", before, st.AdaptiveRate)
		}
	})
}

// An in-flight share that rounds below one is one, so that the instance's clients do not
// wait for ever (ADR 7 says what that costs).
func TestBudgetInFlightShareIsAtLeastOne(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupOn(t, 8, Config{Policy: schedule.Policy{Interval: time.Second}, Budget: governor.Budget{MaxInFlight: 3}})
		l := newTestLoop(t, b)
		l.ownership(lease.Event{Kind: lease.Acquired, Partition: 0, ValidUntil: b.clock.now().Add(time.Hour)})
		subj := laneOf(0, "alice")
		b.src.add(subj, "r1", start)
		l.notify(subj)
		b.clock.advance(time.Second)
		l.startDue()
		if n := l.sched.InFlight(); n != 1 {
			t.Fatalf("%d in flight with a share of 3 × 1/8, want 1", n)
		}
		if !strings.Contains(b.log.String(), "less than one attempt") {
			t.Fatal("no warning that the share was raised to one")
		}
	})
}

// A partition handed back under an in-flight budget is released only once this
// instance's attempts in flight are within its share without it.
func TestHandBackWaitsForTheInFlightShare(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, Config{Policy: schedule.Policy{Interval: time.Second}, Budget: governor.Budget{MaxInFlight: 4}})
		release, open := gate(t)
		b.snd.answer = func(request.Stored, int) error { <-release; return nil }
		l := newTestLoop(t, b)
		ownAll(b, l)
		for i, c := range names("c", 4) {
			subj := laneOf(i%3, c) // partitions 0-2: none in 3
			b.src.add(subj, c, start)
			l.notify(subj)
		}
		b.clock.advance(time.Second)
		l.startDue()
		if n := l.sched.InFlight(); n != 4 {
			t.Fatalf("%d in flight, want 4 (the whole budget)", n)
		}
		handBack(t, l, 3, open, "partition 3 released with 4 in flight and a share of 3 without it",
			"partition 3 not released once in flight came within the share")
	})
}

// A lane held back by the in-flight share that then goes away (its partition lost) does
// not leave the loop thinking it is held back: its timer must wake for the next lane due.
func TestHeldBackDoesNotOutliveTheHeldLane(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, Config{Policy: schedule.Policy{Interval: time.Second}, Budget: governor.Budget{MaxInFlight: 4}})
		release, _ := gate(t)
		b.snd.answer = func(request.Stored, int) error { <-release; return nil }
		l := newTestLoop(t, b)
		ownAll(b, l)
		for i, c := range names("c", 5) {
			subj := laneOf(min(i, 3), c) // the fifth shares partition 3 with the fourth
			b.src.add(subj, c, start)
			l.notify(subj)
		}
		b.clock.advance(time.Second)
		l.startDue()
		if held, _ := b.d.gov.HeldBack(); !held || l.sched.InFlight() != 4 {
			t.Fatalf("4 in flight and one held back expected; in flight %d, held %v", l.sched.InFlight(), held)
		}
		l.sched.ForgetWaiting(func(request.Lane) bool { return true }) // the held lane goes (as on a lost lease)
		l.startDue()
		if held, _ := b.d.gov.HeldBack(); held {
			t.Fatal("still held back with no lane due: the loop would stop its timer")
		}
	})
}

// Adaptive mode finds raven's capacity, on the test's clock: raven takes C attempts a
// second (a token bucket with a tenth of a second's burst, the integration test's raven)
// and answers 503 to the rest; 100 clients offer up to 400 a second. After 20 s, every
// 5-second window is at most 1.05·C, their mean is at least 0.7·C, and fewer than 10% of
// the attempts are refused. The integration test runs the same raven against three
// processes, where a loaded machine's delays bunch the arrivals: there it checks that
// raven is never sent more than it takes, and the pause; this one, how close it settles.
func TestAdaptiveConvergesToCapacity(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const capacity = 60.0
		b := setup(t, Config{Policy: schedule.Policy{Interval: 250 * time.Millisecond}, Adaptive: governor.Adaptive{Enabled: true}})
		l := newTestLoop(t, b)
		ownAll(b, l)
		queue(b, l, names("c", 100), 100)
		var mu sync.Mutex // the answer is given by the workers, several at once
		tokens, last := capacity/10, b.clock.now()
		refused := map[time.Time]int{}
		b.snd.answer = func(request.Stored, int) error {
			mu.Lock()
			defer mu.Unlock()
			now := b.clock.now()
			tokens, last = min(capacity/10, tokens+now.Sub(last).Seconds()*capacity), now
			if tokens >= 1 {
				tokens--
				return nil
			}
			refused[now]++
			return raven.Classify(503, "", now)
		}
		b.clock.advance(250 * time.Millisecond) // the fence
		t0 := b.clock.now()
		drive(t, b, l, 30*time.Second, 5*time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		converged := t0.Add(20 * time.Second)
		var windows [2]int
		var no int
		for _, a := range b.snd.attempts() {
			if w := int(a.at.Sub(converged) / (5 * time.Second)); !a.at.Before(converged) && w < len(windows) {
				windows[w]++
			}
		}
		for at, n := range refused {
			if !at.Before(converged) {
				no += n
			}
		}
		rates := []float64{float64(windows[0]) / 5, float64(windows[1]) / 5}
		t.Logf("after 20 s: %v attempts/s in 5 s windows (capacity %.0f), %d of %d refused; %+v",
			rates, capacity, no, windows[0]+windows[1], b.d.BudgetState())
		for _, r := range rates {
			if r > 1.05*capacity {
				t.Errorf("a 5 s window at %.1f attempts/s, over raven's capacity %.0f by more than 5%%", r, capacity)
			}
		}
		if mean := (rates[0] + rates[1]) / 2; mean < 0.7*capacity {
			t.Errorf("%.1f attempts/s on average after 20 s, want at least 0.7 of raven's capacity %.0f: adaptive mode held back far more than raven asked", mean, capacity)
		}
		if share := float64(no) / float64(windows[0]+windows[1]); share >= 0.10 {
			t.Errorf("%.1f%% of attempts refused after 20 s, want under 10%%", 100*share)
		}
	})
}
