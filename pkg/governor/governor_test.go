package governor

import (
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// Unit tests of the governor alone, on the test's clock; pkg/dispatch's tests run it in
// the loop.

var start = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// sendTimeout is the send timeout adaptive mode's defaults follow (the dispatcher's
// default).
const sendTimeout = 10 * time.Second

// newTest is a Governor over 4 partitions with adaptive mode's defaults filled in.
func newTest(b Budget, ad Adaptive) *Governor {
	return New(b, ad.WithDefaults(sendTimeout), 4, nil, zerolog.Nop())
}

// feed gives g one period of n attempts, bad of them refused, each taking took, and ends
// the period.
func feed(g *Governor, from time.Time, n, bad int, took time.Duration) time.Time {
	at := from
	for i := range n {
		g.Finished(schedule.Result{AttemptEnd: at, Took: took, Refused: i < bad}, true, at)
		at = at.Add(g.ad.Period / time.Duration(n))
	}
	end := from.Add(g.ad.Period)
	g.Finished(schedule.Result{AttemptEnd: end, Took: took, Refused: bad == n}, true, end) // ends the period
	return end
}

// Adaptive mode: refusals cut the rate to no more than raven took, answers to attempts
// sent before a cut do not judge it, good periods while the rate binds raise
// it by a step, and never above a static budget.
func TestAdaptiveCutsAndRaises(t *testing.T) {
	t.Parallel()
	g := newTest(Budget{}, Adaptive{Enabled: true, Start: 1000})
	g.Count(4, time.Time{}, start)
	at := feed(g, start, 300, 200, 10*time.Millisecond) // 300/s sent, 100/s taken
	st := g.Published()
	if st.AdaptiveRate < 95 || st.AdaptiveRate > 101 || !strings.HasPrefix(st.Why, WhyRefused) {
		t.Fatalf("after 2 of 3 refused at 300/s: %+v, want a cut to about what raven took (100/s)", st)
	}
	cut := st.AdaptiveRate
	at = feed(g, at, 100, 50, 2*time.Second) // answers to attempts sent before the cut
	if st := g.Published(); st.AdaptiveRate != cut {
		t.Fatalf("cut again by answers to attempts sent before the last cut: %v, want %v", st.AdaptiveRate, cut)
	}
	g.winBound = true
	at = feed(g, at, 100, 0, 10*time.Millisecond)
	g.winBound = true
	at = feed(g, at, 100, 0, 10*time.Millisecond)
	st = g.Published()
	if want := cut + 2*DefaultAdaptiveIncrease*301; st.AdaptiveRate < want-0.01 || st.AdaptiveRate > want+0.01 { // steps of 5% of the 301/s offered before the first cut
		t.Fatalf("after two good periods: %v, want %v", st.AdaptiveRate, want)
	}
	// Not bound: the rate is not what held the sends back, so it does not grow.
	before := st.AdaptiveRate
	at = feed(g, at, 100, 0, 10*time.Millisecond)
	if st := g.Published(); st.AdaptiveRate != before {
		t.Fatalf("grew while not binding: %v", st.AdaptiveRate)
	}
	// Slow answers cut too.
	feed(g, at, 100, 0, 3*sendTimeout/8) // over the target, a quarter of the timeout
	if st := g.Published(); st.AdaptiveRate >= before || !strings.HasPrefix(st.Why, WhySlow) {
		t.Fatalf("slow answers: %+v, want a cut, why slow", st)
	}
}

// A static budget caps adaptive mode's start and its rises.
func TestAdaptiveNeverAboveTheBudget(t *testing.T) {
	t.Parallel()
	g := newTest(Budget{MaxRate: 50}, Adaptive{Enabled: true, Start: 1000})
	g.Count(4, time.Time{}, start)
	if st := g.Published(); st.AdaptiveRate != 50 {
		t.Fatalf("start: %v, want the budget (50) rather than the start of 1000", st.AdaptiveRate)
	}
	at := feed(g, start, 50, 10, time.Millisecond)
	for range 40 {
		g.winBound = true
		at = feed(g, at, 50, 0, time.Millisecond)
	}
	if st := g.Published(); st.AdaptiveRate != 50 || st.EffectiveRate != 50 {
		t.Fatalf("after 40 good periods: %+v, want 50 (the budget)", st)
	}
}

// The bucket: tokens at the rate up to the burst, and a token given back is there again.
func TestBucket(t *testing.T) {
	t.Parallel()
	var bk bucket
	bk.set(100, start) // burst 5
	for i := range 5 {
		if ok, _ := bk.ready(start); !ok {
			t.Fatalf("token %d of a full bucket missing", i)
		}
		bk.take()
	}
	ok, at := bk.ready(start)
	if ok || at.Sub(start) != 10*time.Millisecond {
		t.Fatalf("empty bucket: ready %v at %v, want the next token in 10ms", ok, at.Sub(start))
	}
	bk.refund()
	if ok, _ := bk.ready(start); !ok {
		t.Fatal("a token given back is not there")
	}
	if ok, _ := bk.ready(start.Add(time.Hour)); !ok || bk.tokens != 5 {
		t.Fatalf("after an hour: %v tokens, want the burst (5)", bk.tokens)
	}
	var tiny bucket
	tiny.set(1e-12, start)
	tiny.take()
	if _, at := tiny.ready(start); at.Before(start) || at.After(start.Add(time.Hour)) {
		t.Fatalf("a tiny rate's next token at %v, want within the hour (no overflow)", at)
	}
}

// After an outage (a streak of cuts down to the floor), the rate comes back in steps of
// the rate held before the streak, not of the floor: within 1/Increase good periods.
func TestAdaptiveRecoversFromAnOutageInSteps(t *testing.T) {
	t.Parallel()
	g := newTest(Budget{}, Adaptive{Enabled: true})
	g.Count(4, time.Time{}, start)
	at := feed(g, start, 120, 20, time.Millisecond) // 120/s offered, 100/s taken
	held := g.Published().AdaptiveRate
	for range 8 { // raven down: everything refused
		at = feed(g, at, 10, 10, time.Millisecond)
	}
	if st := g.Published(); st.AdaptiveRate > 2 {
		t.Fatalf("after an outage: %v, want the floor", st.AdaptiveRate)
	}
	periods := 0
	for g.Published().AdaptiveRate < held && periods < 100 {
		g.winBound = true
		at = feed(g, at, 10, 0, time.Millisecond)
		periods++
	}
	if periods > int(1/DefaultAdaptiveIncrease)+1 {
		t.Fatalf("back to %v after %d good periods, want within %d", held, periods, int(1/DefaultAdaptiveIncrease)+1)
	}
}

// Adaptive mode starts low and doubles while raven answers well and the rate binds; the
// first refusals end the doubling.
func TestAdaptiveSlowStart(t *testing.T) {
	t.Parallel()
	g := newTest(Budget{}, Adaptive{Enabled: true})
	g.Count(4, time.Time{}, start)
	if st := g.Published(); st.AdaptiveRate != DefaultAdaptiveStart || st.EffectiveRate != DefaultAdaptiveStart {
		t.Fatalf("at start: %+v, want %v", st, DefaultAdaptiveStart)
	}
	at := start
	for _, want := range []float64{20, 40, 80} {
		g.winBound = true
		at = feed(g, at, 10, 0, time.Millisecond)
		if got := g.Published().AdaptiveRate; got != want {
			t.Fatalf("slow start: %v, want %v", got, want)
		}
	}
	at = feed(g, at, 80, 20, time.Millisecond)
	cut := g.Published().AdaptiveRate
	g.winBound = true
	feed(g, at, 50, 0, time.Millisecond)
	if got := g.Published().AdaptiveRate; got >= 2*cut || got <= cut {
		t.Fatalf("after the first cut (to %v): %v, want a step up, no longer doubling", cut, got)
	}
}

// A start with raven refusing everything learns nothing of its capacity: once raven
// answers, the rate doubles again from the floor instead of creeping up a step at a time.
func TestAdaptiveStartWithRavenDownKeepsDoubling(t *testing.T) {
	t.Parallel()
	g := newTest(Budget{}, Adaptive{Enabled: true})
	g.Count(4, time.Time{}, start)
	at := start
	for range 5 {
		at = feed(g, at, 10, 10, time.Millisecond)
	}
	if got := g.Published().AdaptiveRate; got != adaptiveFloor {
		t.Fatalf("raven down from the start: %v, want the floor", got)
	}
	for _, want := range []float64{2, 4, 8, 16} {
		g.winBound = true
		at = feed(g, at, 10, 0, time.Millisecond)
		if got := g.Published().AdaptiveRate; got != want {
			t.Fatalf("raven back: %v, want %v (doubling)", got, want)
		}
	}
}
