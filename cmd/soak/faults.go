package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/penguinhq/dispatcher/pkg/fault"
	"github.com/penguinhq/dispatcher/pkg/ledger"
	"github.com/penguinhq/dispatcher/pkg/queue"
)

// soak is one run: the cluster, the services, raven, the load and the faults so far.
type soak struct {
	run
	rng         *rand.Rand
	c           *cluster
	ingests     []*service
	dispatchers []*service // the live one in each slot
	retired     []*service // stopped or replaced, kept for their logs
	raven       *ledger.Ledger
	ravenProxy  *fault.Proxy
	ravenSrv    *http.Server
	mode        atomic.Pointer[ledger.Response] // what raven does now; nil answers 200
	load        *load
	q           *queue.Queue // the soak's own view of the queue
	leases      *queue.Leases
	stats       map[string]*faultStat
	kills       []kill
	start       time.Time
	diskFaults  bool
}

type faultStat struct {
	count    int
	longest  time.Duration // from the fault's end to full recovery
	failures int           // times it did not recover within the bound
}

type kill struct {
	id string
	at time.Time
	// gone is when its links (the fault proxies between it and raven and NATS) were
	// closed: what it wrote before the kill may reach raven until then.
	gone time.Time
}

// faultKind is one kind of fault: apply puts it on and returns what takes it off.
type faultKind struct {
	name     string
	min, max time.Duration // how long it stays on
	apply    func(s *soak) (what string, heal func(), err error)
	possible func(s *soak) bool
}

// respond answers raven's arrivals as the current mode says.
func (s *soak) respond(ledger.Arrival) ledger.Response {
	if m := s.mode.Load(); m != nil {
		return *m
	}
	return ledger.Response{}
}

func (s *soak) ravenMode(r ledger.Response) func(*soak) (string, func(), error) {
	return func(s *soak) (string, func(), error) {
		s.mode.Store(&r)
		return "", func() { s.mode.Store(nil) }, nil
	}
}

func (s *soak) kinds() []faultKind {
	hold := func(d time.Duration) time.Duration { return d }
	return []faultKind{
		{name: "raven refuses connections", min: 2 * time.Second, max: 6 * time.Second, apply: func(s *soak) (string, func(), error) {
			s.ravenProxy.Refuse()
			return "", s.ravenProxy.Heal, nil
		}},
		{name: "raven blackholed (network partition)", min: 2 * time.Second, max: 6 * time.Second, apply: func(s *soak) (string, func(), error) {
			s.ravenProxy.Blackhole()
			return "", s.ravenProxy.Heal, nil
		}},
		{name: "raven drops the connection after the request", min: 2 * time.Second, max: 5 * time.Second, apply: s.ravenMode(ledger.Response{Fault: ledger.Drop})},
		{name: "raven resets after the request headers", min: 2 * time.Second, max: 5 * time.Second, apply: s.ravenMode(ledger.Response{Fault: ledger.Reset})},
		{name: "raven stalls the body after 200", min: 2 * time.Second, max: 4 * time.Second, apply: s.ravenMode(ledger.Response{Fault: ledger.StallBody})},
		{name: "raven stalls the body after 503", min: 2 * time.Second, max: 4 * time.Second, apply: s.ravenMode(ledger.Response{Status: http.StatusServiceUnavailable, Fault: ledger.StallBody})},
		{name: "raven slower than RAVEN_TIMEOUT", min: 2 * time.Second, max: 5 * time.Second, apply: s.ravenMode(ledger.Response{Delay: 2 * s.ravenTimeout})},
		{name: "raven answers a huge body", min: hold(time.Second), max: 3 * time.Second, apply: s.ravenMode(ledger.Response{Fault: ledger.HugeBody})},
		{name: "raven answers 503 with Retry-After", min: 2 * time.Second, max: 6 * time.Second, apply: s.ravenMode(ledger.Response{Status: http.StatusServiceUnavailable, RetryAfter: "1"})},
		{name: "raven answers 429 with Retry-After", min: 2 * time.Second, max: 6 * time.Second, apply: s.ravenMode(ledger.Response{Status: http.StatusTooManyRequests, RetryAfter: "1"})},
		{name: "raven answers 3xx (dead letters)", min: 300 * time.Millisecond, max: time.Second, apply: s.ravenMode(ledger.Response{Status: http.StatusFound, Location: "http://example.invalid/"})},
		{name: "a dispatcher's link to NATS cut", min: 10 * time.Second, max: 10 * time.Second, apply: func(s *soak) (string, func(), error) {
			d := s.dispatchers[s.rng.IntN(len(s.dispatchers))]
			d.cut(false)
			return d.id, d.heal, nil
		}},
		{name: "a dispatcher's link to NATS blackholed", min: 10 * time.Second, max: 10 * time.Second, apply: func(s *soak) (string, func(), error) {
			d := s.dispatchers[s.rng.IntN(len(s.dispatchers))]
			d.cut(true)
			return d.id, d.heal, nil
		}},
		{name: "an ingest's link to NATS cut mid-publish", min: 3 * time.Second, max: 6 * time.Second, apply: func(s *soak) (string, func(), error) {
			i := s.ingests[s.rng.IntN(len(s.ingests))]
			i.cut(false)
			return i.p.name, i.heal, nil
		}},
		{name: "an ingest's link to NATS blackholed mid-publish", min: 3 * time.Second, max: 6 * time.Second, apply: func(s *soak) (string, func(), error) {
			i := s.ingests[s.rng.IntN(len(s.ingests))]
			i.cut(true)
			return i.p.name, i.heal, nil
		}},
		{name: "a NATS node partitioned from the others", min: 10 * time.Second, max: 10 * time.Second, apply: func(s *soak) (string, func(), error) {
			n := s.rng.IntN(len(s.c.nodes))
			if l := s.c.leader(s.q); l >= 0 && s.rng.IntN(2) == 0 {
				n = l
			}
			s.c.partition(n, true)
			return s.c.nodes[n].name, func() { s.c.partition(n, false) }, nil
		}},
		{name: "the stream leader's disk full", min: 4 * time.Second, max: 8 * time.Second, possible: func(s *soak) bool { return s.diskFaults }, apply: func(s *soak) (string, func(), error) {
			n := s.c.leader(s.q)
			if n < 0 {
				n = s.rng.IntN(len(s.c.nodes))
			}
			free, err := s.c.fill(n)
			if err != nil {
				return "", nil, err
			}
			return s.c.nodes[n].name, func() { _ = free() }, nil
		}},
		{name: "a dispatcher paused (SIGSTOP) past its lease", min: s.leaseTTL + 2*time.Second, max: s.leaseTTL + 4*time.Second, apply: func(s *soak) (string, func(), error) {
			d := s.dispatchers[s.rng.IntN(len(s.dispatchers))]
			_ = d.p.Signal(syscall.SIGSTOP)
			return d.id, func() { _ = d.p.Signal(syscall.SIGCONT) }, nil
		}},
		{name: "a dispatcher killed (SIGKILL) and replaced", apply: func(s *soak) (string, func(), error) {
			slot := s.rng.IntN(len(s.dispatchers))
			d := s.dispatchers[slot]
			_ = d.p.Signal(syscall.SIGKILL)
			killed := kill{id: d.id, at: time.Now()}
			<-d.p.Done()
			s.retired = append(s.retired, d)
			for _, l := range d.links {
				l.Close()
			}
			killed.gone = time.Now()
			s.kills = append(s.kills, killed)
			nd, err := s.startDispatcher(s.c, slot, d.gen+1)
			if err != nil {
				return "", nil, err
			}
			s.dispatchers[slot] = nd
			return d.id, func() {}, nil
		}},
		{name: "the lease store's clock jumps forward (leases expire early)", apply: func(s *soak) (string, func(), error) {
			return "", func() {}, s.c.expireLeases()
		}},
	}
}

// recovered says whether the whole service is back: every process ready, every
// partition held by a live dispatcher, the cluster healthy with a current request stream
// on every node, and both a request accepted and one delivered since `since`.
func (s *soak) recovered(since time.Time) bool {
	live := map[string]bool{}
	for _, d := range s.dispatchers {
		if !d.p.ready() {
			return false
		}
		live[d.id] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	owners, err := s.leases.Owners(ctx)
	cancel()
	if err != nil || len(owners) != queue.DefaultPartitions {
		return false
	}
	for _, id := range owners {
		if !live[id] {
			return false
		}
	}
	for _, i := range s.ingests {
		if !i.p.ready() {
			return false
		}
	}
	return s.load.lastAccept.Load() > since.UnixNano() && s.raven.LastDelivered().After(since) && s.c.healthy(s.q)
}

// faultRound applies one fault, takes it off, and measures the time to full recovery.
func (s *soak) faultRound(ctx context.Context, kinds []faultKind, bound time.Duration) error {
	var k faultKind
	for {
		k = kinds[s.rng.IntN(len(kinds))]
		if k.possible == nil || k.possible(s) {
			break
		}
	}
	hold := k.min
	if k.max > k.min {
		hold += time.Duration(s.rng.Int64N(int64(k.max - k.min)))
	}
	what, heal, err := k.apply(s)
	if err != nil {
		return fmt.Errorf("%s: %w", k.name, err)
	}
	select {
	case <-time.After(hold):
	case <-ctx.Done():
	}
	heal()
	ended := time.Now()
	st := s.stats[k.name]
	if st == nil {
		st = &faultStat{}
		s.stats[k.name] = st
	}
	st.count++
	if err := waitUntil(ctx, bound, func() bool { return s.recovered(ended) }); err != nil {
		st.failures++
		fmt.Printf("[%6.1fs] %s %s for %s: NOT recovered: %v\n", time.Since(s.start).Seconds(), k.name, what, hold.Round(100*time.Millisecond), err)
		return nil
	}
	took := time.Since(ended)
	st.longest = max(st.longest, took)
	fmt.Printf("[%6.1fs] %s %s for %s: recovered in %s\n", time.Since(s.start).Seconds(), k.name, what, hold.Round(100*time.Millisecond), took.Round(10*time.Millisecond))
	return nil
}

func (s *soak) faultNames() []string {
	var names []string
	for n := range s.stats {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
