package integration

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/ledger"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// firstN answers with fault for the first n arrivals of each request that match (nil
// matches all), then 200.
func firstN(n int, match func(ledger.Arrival) bool, fault ledger.Response) func(ledger.Arrival) ledger.Response {
	var mu sync.Mutex
	seen := map[string]int{}
	return func(a ledger.Arrival) ledger.Response {
		mu.Lock()
		defer mu.Unlock()
		if seen[a.ID] < n && (match == nil || match(a)) {
			seen[a.ID]++
			return fault
		}
		return ledger.Response{}
	}
}

// The raven fault matrix: raven (or the network in front of it) misbehaves in each way a
// real one does, and every guarantee holds. Each case ends with the ledger check, which
// here also requires every attempt to have arrived at most once (one dispatcher runs
// throughout, so a second arrival of one attempt number could only be a resend the
// dispatcher did not know of), and the dispatcher's count of attempts to equal what
// raven saw (except where the network kept the attempt from raven).
func TestRavenFaults(t *testing.T) {
	t.Parallel()
	// Long enough that a loaded machine does not turn a prompt answer into a timeout (the
	// check below wants attempts and arrivals to match exactly); the timeout cases pay it.
	const timeout = 3 * time.Second
	reused := func(a ledger.Arrival) bool { return a.OnConn > 1 }
	fresh := func(a ledger.Arrival) bool { return a.OnConn == 1 }
	cases := []struct {
		name    string
		respond func(ledger.Arrival) ledger.Response
		network func(s *stack) // a fault in the network instead, put on and taken off
		dead    int            // requests that end in the dead-letter stream
	}{
		{name: "ConnectionRefused", network: func(s *stack) {
			s.ravenProxy.Refuse()
			time.Sleep(time.Second)
			s.ravenProxy.Heal()
		}},
		{name: "ResetAfterRequestHeaders", respond: firstN(2, nil, ledger.Response{Fault: ledger.Reset})},
		{name: "DroppedOnReusedConnection", respond: firstN(2, reused, ledger.Response{Fault: ledger.Drop})},
		{name: "DroppedOnFreshConnection", respond: firstN(2, fresh, ledger.Response{Fault: ledger.Drop})},
		{name: "StalledBodyAfter503", respond: firstN(1, nil, ledger.Response{Status: http.StatusServiceUnavailable, Fault: ledger.StallBody})},
		{name: "StalledBodyAfter200", respond: firstN(1, nil, ledger.Response{Fault: ledger.StallBody})},
		{name: "SlowerThanTimeout", respond: firstN(1, nil, ledger.Response{Delay: 2 * timeout})},
		{name: "Blackhole", network: func(s *stack) {
			s.ravenProxy.Blackhole()
			time.Sleep(time.Second)
			s.ravenProxy.Heal()
		}},
		{name: "HugeResponseBody", respond: firstN(1, nil, ledger.Response{Fault: ledger.HugeBody})},
		{name: "Redirect", respond: firstN(1, func(a ledger.Arrival) bool { return a.ClientID == clientName(0) },
			ledger.Response{Status: http.StatusFound, Location: "http://example.invalid/"}), dead: 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newStack(t, options{interval: 100 * time.Millisecond, timeout: timeout, respond: c.respond,
				ravenProxy: c.network != nil, noStart: c.network != nil,
				policy: schedule.Policy{BackoffBase: 100 * time.Millisecond, BackoffMax: 200 * time.Millisecond, MaxAttempts: 100}})
			s.attemptsOnce = true
			const clients, each = 3, 3
			for c := range clients {
				for n := range each {
					s.post(clientName(c), n)
				}
			}
			if c.network != nil {
				s.ravenProxy.Refuse() // the fault is on when the first attempts go
				s.startDispatcher()
				waitFor(t, time.Minute, "an attempt kept from raven by the fault", func() bool {
					return gather(t, s.metrics)[`dispatch_attempts_total{outcome="transient_failure"}`] >= 1
				})
				c.network(s)
			}
			rep := s.finish(time.Minute, 0)
			if rep.Dead != c.dead {
				t.Errorf("%d requests dead-lettered, want %d", rep.Dead, c.dead)
			}
			faulty := 0
			for _, a := range s.ledger.Arrivals() {
				if a.Fault != 0 || a.Aborted || a.Status != http.StatusOK {
					faulty++
				}
			}
			if c.network == nil && faulty == 0 {
				t.Error("raven never misbehaved: the case did not exercise its fault")
			}
			m := gather(t, s.metrics)
			attempts := m[`dispatch_attempts_total{outcome="delivered"}`] + m[`dispatch_attempts_total{outcome="transient_failure"}`] + m[`dispatch_attempts_total{outcome="permanent_failure"}`]
			switch {
			case c.network == nil && int(attempts) != rep.Arrivals:
				t.Errorf("the dispatcher counted %v attempts, raven saw %d", attempts, rep.Arrivals)
			case c.network != nil && int(attempts) <= rep.Arrivals:
				t.Errorf("the dispatcher counted %v attempts, raven saw %d: the fault kept none from raven", attempts, rep.Arrivals)
			}
		})
	}
}
