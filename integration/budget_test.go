package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/ledger"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// Raven's budget across dispatcher instances: tests with dispatcher processes on a
// 3-node cluster (adaptive mode against a raven of fixed capacity; a static budget kept
// through a kill and changed at runtime), and fairness on one instance.

// capacityRaven is a raven with a true capacity: a token bucket of rate attempts a
// second (a tenth of a second's worth of burst) that answers 503 beyond it. While
// overloaded it answers every attempt 503 with a Retry-After of the time left.
type capacityRaven struct {
	mu         sync.Mutex
	rate       float64
	tokens     float64
	last       time.Time
	pauseUntil time.Time
}

func newCapacityRaven(rate float64) *capacityRaven {
	return &capacityRaven{rate: rate, tokens: rate / 10}
}

func (c *capacityRaven) respond(a ledger.Arrival) ledger.Response {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := a.Start
	if now.Before(c.pauseUntil) {
		secs := int(math.Ceil(c.pauseUntil.Sub(now).Seconds()))
		return ledger.Response{Status: http.StatusServiceUnavailable, RetryAfter: fmt.Sprint(secs)}
	}
	if !c.last.IsZero() && now.After(c.last) {
		c.tokens = min(c.rate/10, c.tokens+now.Sub(c.last).Seconds()*c.rate)
	}
	c.last = later(c.last, now)
	if c.tokens >= 1 {
		c.tokens--
		return ledger.Response{Delay: 2 * time.Millisecond}
	}
	return ledger.Response{Status: http.StatusServiceUnavailable}
}

// overload makes raven answer 503 with Retry-After to everyone for d from now.
func (c *capacityRaven) overload(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pauseUntil = time.Now().Add(d)
	return c.pauseUntil
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// postMany queues n requests for each client, from 8 goroutines, each client's in order.
func (s *stack) postMany(clients []string, n int) {
	s.t.Helper()
	var wg sync.WaitGroup
	work := make(chan string)
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			for c := range work {
				for k := range n {
					a, err := s.tryPost(jsonHeader(), fmt.Appendf(nil, `{"clientId":%q,"n":%d}`, c, k))
					if err == nil && a.Status != http.StatusAccepted {
						err = fmt.Errorf("post for %s: %d %v", c, a.Status, a.Body)
					}
					if err != nil {
						select {
						case errs <- err:
						default:
						}
						return
					}
				}
			}
		})
	}
	for _, c := range clients {
		work <- c
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		s.t.Fatal(err)
	default:
	}
}

// checkSent checks, once the dispatchers have stopped, what was sent so far: the ledger's
// checks (order, gaps, duplicates) on every client's requests up to its last attempt, and
// that every accepted request is either delivered or still queued (none lost).
func (s *stack) checkSent() {
	s.t.Helper()
	arrivals := s.ledger.Arrivals()
	attempted, delivered := map[string]bool{}, map[string]bool{}
	perClient := map[string]int{}
	for _, a := range arrivals {
		if !attempted[a.ID] {
			attempted[a.ID] = true
			perClient[a.ClientID]++
		}
		if a.Status/100 == 2 {
			delivered[a.ID] = true
		}
	}
	// A client's head may have been attempted and not delivered yet: it is still queued,
	// which the count below checks; the ledger is told so through Dead.
	pending := map[string]bool{}
	s.mu.Lock()
	var sent []ledger.Accepted
	for _, a := range s.accepted {
		if perClient[a.ClientID] > 0 {
			sent = append(sent, a)
			perClient[a.ClientID]--
			if !delivered[a.ID] {
				pending[a.ID] = true
			}
		}
	}
	accepted := len(s.accepted)
	s.mu.Unlock()
	rep := ledger.Check(arrivals, ledger.Expect{Interval: s.opts.interval, Accepted: sent, Dead: pending})
	s.t.Logf("ledger of what was sent: %s (%d attempted, not yet delivered)", rep, len(pending))
	for _, v := range rep.Violations {
		s.t.Errorf("guarantee broken: %s", v)
	}
	if q := s.queued(); q+rep.Delivered != accepted {
		s.t.Errorf("%d delivered and %d still queued of %d accepted: some were lost", rep.Delivered, q, accepted)
	}
}

func clientNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = clientName(i)
	}
	return out
}

// rates counts the attempts that arrived at raven in windows of w from..to, and how many
// of them raven refused (503).
func rates(arrivals []ledger.Arrival, from, to time.Time, w time.Duration) (perSecond []float64, attempts, refused int) {
	for t := from; !t.Add(w).After(to); t = t.Add(w) {
		n := 0
		for _, a := range arrivals {
			if !a.Start.Before(t) && a.Start.Before(t.Add(w)) {
				n++
			}
		}
		perSecond = append(perSecond, float64(n)/w.Seconds())
	}
	for _, a := range arrivals {
		if !a.Start.Before(from) && a.Start.Before(to) {
			attempts++
			if a.Status == http.StatusServiceUnavailable {
				refused++
			}
		}
	}
	return perSecond, attempts, refused
}

// budgets asks every dispatcher for its view of raven's budget.
func (s *stack) budgets() map[string]dispatch.BudgetState {
	answers, _ := s.q.QueryLanes(context.Background(), queue.LaneQuery{Budget: true}, 300*time.Millisecond)
	out := map[string]dispatch.BudgetState{}
	for _, raw := range answers {
		var a dispatch.LaneAnswer
		if json.Unmarshal(raw, &a) == nil && a.Budget != nil {
			out[a.Instance] = *a.Budget
		}
	}
	return out
}

// Adaptive mode against a raven of capacity C, with no static budget: three instances
// converge to between 0.8·C and 1.05·C within 30 s (every 5-second window after that),
// and then fewer than 5% of attempts are refused. Then raven answers 503 with
// Retry-After for 3 s: no instance sends during it, and sends resume after it at about
// the rate before. Nothing is lost, no gap is below the interval.
func TestAdaptiveConvergesToRavenCapacity(t *testing.T) {
	const capacity = 60.0
	raven := newCapacityRaven(capacity)
	// Leases of 6 s, not the cluster tests' 2 s: on a loaded 2-core CI machine under the
	// race detector an instance stalled past 2 s lost its partitions mid-measurement, and
	// what this test measures is the rates, not lease handover.
	c := newClusterStack(t, options{interval: 250 * time.Millisecond, respond: raven.respond, leaseTTL: 6 * time.Second})
	c.env = with(c.env, "RAVEN_ADAPTIVE", "true", "RAVEN_TIMEOUT", "1s", "RAVEN_LATENCY_TARGET", "500ms")
	clients := clientNames(100) // up to 400 attempts/s: far over raven's 60
	c.postMany(clients, 60)     // more than is sent during the test: what is left stays queued
	var procs []*proc
	for _, id := range []string{"a", "b", "c"} {
		procs = append(procs, c.startDispatcher(id))
	}
	waitFor(t, 30*time.Second, "three instances to share the partitions", func() bool {
		o := c.owners()
		return len(o) == 3 && o["a"]+o["b"]+o["c"] == 64
	})
	waitFor(t, 30*time.Second, "the first attempts", func() bool { return len(c.ledger.Arrivals()) > 0 })
	first := c.ledger.Arrivals()[0].Start
	converged := first.Add(30 * time.Second)
	time.Sleep(time.Until(converged.Add(15 * time.Second)))
	windows, attempts, refused := rates(c.ledger.Arrivals(), converged, converged.Add(15*time.Second), 5*time.Second)
	t.Logf("after 30 s: attempts/s in 5 s windows %.1f (capacity %.0f); %d attempts, %d refused; instances %v",
		windows, capacity, attempts, refused, c.budgets())
	for _, r := range windows {
		if r < 0.8*capacity || r > 1.05*capacity {
			t.Errorf("a 5 s window at %.1f attempts/s, want %.0f to %.0f", r, 0.8*capacity, 1.05*capacity)
		}
	}
	if share := float64(refused) / float64(attempts); share >= 0.05 {
		t.Errorf("%.1f%% of attempts refused after converging, want under 5%%", 100*share)
	}
	before, _, _ := rates(c.ledger.Arrivals(), converged.Add(10*time.Second), converged.Add(15*time.Second), 5*time.Second)

	// Raven-wide overload: 503 with Retry-After to everyone for 3 s.
	start := time.Now()
	until := raven.overload(3 * time.Second)
	time.Sleep(time.Until(until.Add(5 * time.Second)))
	arrivals := c.ledger.Arrivals()
	// Each instance hears of the overload from its own first 503: after that (and the
	// attempts it already had under way, 500 ms), it must send nothing until the
	// Retry-After ends. An instance that takes partitions over during the overload
	// (leases move under load) hears of it later than the others, and that is allowed.
	firstOf := map[string]time.Time{} // instance (User-Agent) -> its first attempt in the overload
	var during []ledger.Arrival
	for _, a := range arrivals {
		if !a.Start.After(start) || !a.Start.Before(until) {
			continue
		}
		who := a.Header.Get("User-Agent")
		first, seen := firstOf[who]
		if !seen {
			firstOf[who] = a.Start
			continue
		}
		if a.Start.After(first.Add(500 * time.Millisecond)) {
			during = append(during, a)
		}
	}
	if len(during) > 0 {
		t.Errorf("%d attempts during raven's Retry-After (the first at %s of 3 s, by %s), want none after each instance's first 503",
			len(during), during[0].Start.Sub(start), during[0].Header.Get("User-Agent"))
	}
	after, _, _ := rates(arrivals, until.Add(2*time.Second), until.Add(5*time.Second), 3*time.Second)
	around, _, _ := rates(arrivals, start.Add(-2*time.Second), until.Add(5*time.Second), time.Second)
	t.Logf("before the overload %.1f/s, after it %.1f/s; each second around it %.0f; instances %+v", before[0], after[0], around, c.budgets())
	if after[0] < 0.8*before[0] || after[0] > 1.05*capacity {
		t.Errorf("after the pause %.1f attempts/s, want about the rate before it (%.1f), at most %.0f", after[0], before[0], 1.05*capacity)
	}
	if c.queued() == 0 {
		t.Fatal("the backlog ran out during the test: raven's capacity was not what bound the rate")
	}
	for _, p := range procs {
		p.signal(syscall.SIGTERM)
	}
	c.checkSent()
}

// A static budget across three instances: every 2-second window stays within 5% over it,
// also while one instance is killed and its partitions move (its share comes back to the
// others only once its leases expired), and with all instances sending it is used to
// within 5%. A change of the budget at runtime is in force on every instance within 1 s,
// and raven sees the new rate.
func TestStaticBudgetAcrossInstances(t *testing.T) {
	const budget = 60.0
	c := newClusterStack(t, options{interval: 250 * time.Millisecond, leaseTTL: 6 * time.Second, // as in the adaptive test
		respond: func(ledger.Arrival) ledger.Response { return ledger.Response{Delay: 2 * time.Millisecond} }})
	c.env = with(c.env, "RAVEN_MAX_RATE", fmt.Sprint(budget))
	clients := clientNames(100)
	const each = 20 // about 1,200 are sent during the test, the rest after it
	c.postMany(clients, each)
	procs := map[string]*proc{}
	for _, id := range []string{"a", "b", "c"} {
		procs[id] = c.startDispatcher(id)
	}
	waitFor(t, 30*time.Second, "three instances to share the partitions", func() bool {
		o := c.owners()
		return len(o) == 3 && o["a"]+o["b"]+o["c"] == 64
	})
	shared := time.Now()
	time.Sleep(7 * time.Second)
	st := c.budgets()
	var shares float64
	for _, s := range st {
		shares += s.ShareRate
	}
	t.Logf("shares %v", st)
	if len(st) != 3 || math.Abs(shares-budget) > 1e-6 {
		t.Errorf("%d instances' shares add up to %.2f, want 3 adding up to the budget %.0f", len(st), shares, budget)
	}

	procs["a"].signal(syscall.SIGKILL)
	killed := time.Now()
	waitFor(t, 30*time.Second, "b and c to hold every partition", func() bool {
		o := c.owners()
		return o["a"] == 0 && o["b"]+o["c"] == 64
	})
	moved := time.Now()
	time.Sleep(5 * time.Second)

	// Runtime change: every instance has it within 1 s.
	ctl, err := c.q.Control(context.Background(), testLog())
	if err != nil {
		t.Fatal(err)
	}
	const lower = 30.0
	r := lower
	if _, err := ctl.UpdateBudget(context.Background(), "test", func(b *request.Budget) { b.MaxRate = &r }); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	waitFor(t, 5*time.Second, "both instances to hold the new budget", func() bool {
		st := c.budgets()
		return len(st) == 2 && st["b"].MaxRate == lower && st["c"].MaxRate == lower
	})
	if took := time.Since(changed); took > time.Second {
		t.Errorf("the new budget was in force on every instance %s after the change, want within 1 s", took)
	}
	time.Sleep(5 * time.Second)
	end := time.Now()

	arrivals := c.ledger.Arrivals()
	check := func(what string, from, to time.Time, b float64, full bool) {
		windows, _, _ := rates(arrivals, from, to, 2*time.Second)
		t.Logf("%s: attempts/s in 2 s windows %.1f (budget %.0f)", what, windows, b)
		var sum float64
		for _, w := range windows {
			if w > 1.05*b {
				t.Errorf("%s: a 2 s window at %.1f attempts/s, over the budget %.0f by more than 5%%", what, w, b)
			}
			sum += w
		}
		if mean := sum / float64(len(windows)); full && mean < 0.95*b {
			t.Errorf("%s: %.1f attempts/s on average, want the budget %.0f used to within 5%%", what, mean, b)
		}
	}
	check("three instances", shared.Add(time.Second), killed, budget, true)
	check("a killed, its partitions moving", killed, moved.Add(time.Second), budget, false)
	check("two instances", moved.Add(time.Second), changed, budget, true)
	check("the lower budget", changed.Add(time.Second), end, lower, true)
	if c.queued() == 0 {
		t.Fatal("the backlog ran out during the test: the budget was not what bound the rate")
	}
	none := 0.0 // no limit: the rest goes at the interval's pace
	if _, err := ctl.UpdateBudget(context.Background(), "test", func(b *request.Budget) { b.MaxRate = &none }); err != nil {
		t.Fatal(err)
	}
	rep := c.finish(60*time.Second, 100)
	if rep.Delivered < len(clients)*each {
		t.Fatalf("delivered %d of %d", rep.Delivered, len(clients)*each)
	}
}

// Fairness under a binding budget, on real JetStream: one client with 10,000 requests
// queued beside 100 clients with one each. Every one of the 100 is sent within 100/B
// plus one interval of the first send, and the big client takes one turn per interval
// like any other.
func TestBudgetIsFair(t *testing.T) {
	const budget = 50.0
	s := newStack(t, options{interval: time.Second, noStart: true, budget: dispatch.Budget{MaxRate: budget}})
	ctx := context.Background()
	const big = 10_000
	for k := range big {
		body := fmt.Appendf(nil, `{"clientId":"big","n":%d}`, k)
		id := request.NewID(time.Now())
		if _, err := s.q.Publish(ctx, request.Request{ID: id, ClientID: "big", Body: body, ContentType: "application/json"}); err != nil {
			t.Fatal(err)
		}
		s.mu.Lock()
		s.accepted = append(s.accepted, ledger.Accepted{ClientID: "big", ID: id})
		s.mu.Unlock()
	}
	small := clientNames(100)
	s.postMany(small, 1)
	s.startDispatcher()
	waitFor(t, 30*time.Second, "every small client to be sent", func() bool {
		sent := map[string]bool{}
		for _, a := range s.ledger.Arrivals() {
			sent[a.ClientID] = true
		}
		return !slices.ContainsFunc(small, func(c string) bool { return !sent[c] })
	})
	arrivals := s.ledger.Arrivals()
	first := arrivals[0].Start
	bound := time.Duration(100/budget*float64(time.Second)) + s.opts.interval
	bigTurns := 0
	for _, a := range arrivals {
		if a.ClientID == "big" {
			bigTurns++
			continue
		}
		if late := a.Start.Sub(first); late > bound {
			t.Errorf("%s sent %s after the first send, want within 100/B + interval = %s", a.ClientID, late, bound)
		}
	}
	t.Logf("the 100 sent within %s of the first send; the big client had %d turns meanwhile", arrivals[len(arrivals)-1].Start.Sub(first), bigTurns)
	s.stopDispatcher()
	s.checkSent()
}
