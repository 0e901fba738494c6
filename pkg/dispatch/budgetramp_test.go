package dispatch

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/penguinhq/dispatcher/pkg/governor"
	"github.com/penguinhq/dispatcher/pkg/lease"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// A start acquires its partitions one at a time, its share worked out again at each:
// over every window from the first attempt on, the attempts stay within ADR 7's bound,
// the budget times the window plus one burst (one token at this rate).
func TestBudgetHoldsWhilePartitionsAreAcquired(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const rate = 10
		b := setup(t, Config{Policy: schedule.Policy{Interval: 100 * time.Millisecond}, Budget: governor.Budget{MaxRate: rate}})
		l := newTestLoop(t, b)
		clients := names("c", 80)
		for p := range b.src.Partitions() {
			l.ownership(lease.Event{Kind: lease.Acquired, Partition: p, ValidUntil: b.clock.now().Add(time.Hour)})
			for i, c := range clients {
				if i%b.src.Partitions() == p {
					subj := laneOf(p, c)
					b.src.add(subj, c+"-0", start)
					l.notify(subj)
				}
			}
			drive(t, b, l, 400*time.Millisecond, 5*time.Millisecond)
		}
		drive(t, b, l, 10*time.Second, 5*time.Millisecond)
		a := b.snd.attempts()
		if len(a) != 80 {
			t.Fatalf("%d attempts, want 80", len(a))
		}
		withinRate(t, a, rate)
	})
}
