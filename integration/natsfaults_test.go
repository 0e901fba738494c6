package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/fault"
	"github.com/penguinhq/dispatcher/pkg/ledger"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// natsFaults are the two ways a link to NATS fails: the peer gone (connections reset,
// new ones refused) and a partition (bytes stop, nobody is told).
var natsFaults = []struct {
	name  string
	apply func(*fault.Proxy)
}{
	{"Cut", (*fault.Proxy).Refuse},
	{"Blackhole", (*fault.Proxy).Blackhole},
}

// proxyTo puts a fault proxy in front of addr for the test.
func proxyTo(t testing.TB, addr string) *fault.Proxy {
	t.Helper()
	p, err := fault.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// arrivedAfter says whether raven saw an attempt start after t.
func (s *stack) arrivedAfter(t time.Time) bool {
	for _, a := range s.ledger.Arrivals() {
		if a.Start.After(t) {
			return true
		}
	}
	return false
}

// The dispatcher process's link to NATS fails for 10 s under load (ingest's does not),
// and comes back. While it is down the dispatcher says it is not ready; within a few
// seconds of its return dispatch resumes by itself; nothing accepted is lost, spacing and
// order hold, and a duplicate only follows a removal failure the dispatcher logged.
func TestDispatcherLinkToNATSFails(t *testing.T) {
	t.Parallel()
	for _, fault := range natsFaults {
		t.Run(fault.name, func(t *testing.T) {
			t.Parallel()
			s := newStack(t, options{interval: 200 * time.Millisecond, noStart: true})
			proxy := proxyTo(t, s.natsAddr)
			opsAddr := freeAddr(t)
			p := startProc(t, map[string]string{"NATS_URL": "nats://" + proxy.Addr(), "RAVEN_URL": s.ravenURL,
				"DISPATCH_INTERVAL": "200ms", "LEASE_TTL": "2s", "RAVEN_TIMEOUT": "500ms", "OPS_ADDR": opsAddr, "INSTANCE_ID": "d1"})
			ops := "http://" + opsAddr
			stopFeed := s.feed(16, 20*time.Millisecond)
			waitFor(t, time.Minute, "deliveries before the fault", func() bool { return s.ledger.Delivered() >= 20 })

			fault.apply(proxy)
			waitForState(t, time.Minute, "the dispatcher to say not ready", func() (bool, string) {
				code := status(ops + "/readyz")
				return code == http.StatusServiceUnavailable, fmt.Sprintf("readyz answered %d", code)
			})
			time.Sleep(10 * time.Second)
			proxy.Heal()
			healedAt := time.Now()
			waitFor(t, time.Minute, "dispatch to resume by itself", func() bool { return s.arrivedAfter(healedAt) })
			waitForState(t, time.Minute, "the dispatcher to be ready again", func() (bool, string) {
				code := status(ops + "/readyz")
				return code == http.StatusOK, fmt.Sprintf("readyz answered %d", code)
			})
			t.Logf("resumed %s after the link came back", time.Since(healedAt).Round(time.Millisecond))
			stopFeed()
			s.waitDone(60 * time.Second)
			p.signal(syscall.SIGTERM)
			s.checkExplained(p.Output())
		})
	}
}

// Ingest's link to NATS fails while requests are being published through it, and comes
// back. Every caller hears 202 or 503, and every 202 is delivered: never a 202 for a
// request that was lost. (A 503 whose publish was stored after all is delivered too; the
// caller's retry with the same Idempotency-Key would find it.)
func TestIngestLinkToNATSFailsMidPublish(t *testing.T) {
	t.Parallel()
	for _, fault := range natsFaults {
		t.Run(fault.name, func(t *testing.T) {
			t.Parallel()
			s := newStack(t, options{interval: 100 * time.Millisecond})
			proxy := proxyTo(t, s.natsAddr)
			addr := freeAddr(t)
			startBin(t, ingestBin, map[string]string{"NATS_URL": "nats://" + proxy.Addr(), "INGEST_ADDR": addr, "PUBLISH_TIMEOUT": "2s"})
			waitReady(t, "http://"+addr)
			s.ingestURL = "http://" + addr + "/v1/requests"
			stopFeed := s.feed(16, 2*time.Millisecond)
			waitFor(t, time.Minute, "requests accepted before the fault", func() bool { return s.acceptedCount() >= 50 })
			fault.apply(proxy)
			time.Sleep(4 * time.Second)
			proxy.Heal()
			healedAt := s.acceptedCount()
			waitFor(t, time.Minute, "requests accepted again after the link came back", func() bool { return s.acceptedCount() > healedAt+20 })
			stopFeed()
			s.mu.Lock()
			refused := s.unavailable
			s.mu.Unlock()
			if refused == 0 {
				t.Fatal("no request was refused while the link was down: the fault was not exercised")
			}
			rep := s.finish(60*time.Second, 0)
			t.Logf("accepted %d, refused with 503 %d, delivered %d (of them never acknowledged %d)", s.acceptedCount(), refused, rep.Delivered, rep.Unacknowledged)
		})
	}
}

// One node of a 3-node cluster (the request stream's leader) is cut off from the other
// two for 10 s while it keeps running, clients still connected to it, then the partition
// heals. The majority goes on; the node catches up; the ledger check holds, with every
// duplicate explained.
//
// A client of the cut-off node keeps its connection (the node is up) and so cannot reach
// the majority until the partition heals: "the majority goes on" needs a dispatcher that
// is connected to it. So b is given only the two other nodes' addresses; a is given all
// three, and may be on either side. (With both given all three, both landed on the
// cut-off node about one run in nine, and nothing could be delivered while it was cut.)
func TestClusterNodePartitioned(t *testing.T) {
	t.Parallel()
	c := newClusterStackWith(t, options{interval: 200 * time.Millisecond}, queuetest.ClusterOptions{ProxyRoutes: true})
	var leader int
	waitForState(t, time.Minute, "a request stream leader", func() (bool, string) {
		leader = c.cluster.StreamLeader(queue.RequestStream)
		return leader >= 0, "none yet"
	})
	var majority []string
	for i := range c.cluster.Nodes {
		if i != leader {
			majority = append(majority, c.cluster.Server(i).ClientURL())
		}
	}
	a := c.startDispatcher("a")
	b := startProc(t, with(c.env, "INSTANCE_ID", "b", "NATS_URL", strings.Join(majority, ",")))
	stopFeed := c.feed(16, 20*time.Millisecond)
	waitFor(t, time.Minute, "deliveries before the fault", func() bool { return c.ledger.Delivered() >= 20 })
	if now := c.cluster.StreamLeader(queue.RequestStream); now != leader {
		// Still a node with clients that are cut off with it; b is on the other side.
		t.Logf("the request stream's leader moved from node %d to node %d before the fault; node %d is cut off", leader+1, now+1, leader+1)
	}
	c.cluster.Partition(leader)
	cutAt := time.Now()
	defer func() {
		for i, n := range c.cluster.Nodes {
			if n != nil && n.Guard.Restarts() > 0 {
				t.Errorf("node %d was restarted %d times by its store guard during a partition", i+1, n.Guard.Restarts())
			}
		}
	}()
	waitFor(t, time.Minute, "deliveries while the node is cut off", func() bool { return c.arrivedAfter(cutAt.Add(5 * time.Second)) })
	time.Sleep(time.Until(cutAt.Add(10 * time.Second)))
	c.cluster.Heal(leader)
	healedAt := time.Now()
	waitForState(t, 2*time.Minute, "the node to be a current replica again", func() (bool, string) {
		n := c.replicasCurrent()
		return n == 3, fmt.Sprintf("%d current", n)
	})
	t.Logf("node %d current again %s after the partition healed", leader+1, time.Since(healedAt).Round(time.Millisecond))
	// Load goes on after the recovery, and is taken.
	more := c.acceptedCount()
	waitFor(t, time.Minute, "more requests accepted after the recovery", func() bool { return c.acceptedCount() >= more+20 })
	stopFeed()
	c.waitDone(90 * time.Second)
	a.signal(syscall.SIGTERM)
	b.signal(syscall.SIGTERM)
	c.checkExplained(a.Output(), b.Output())
}

// A dispatcher is paused (SIGSTOP) for longer than its lease while sending, another takes
// its partitions over, and it is resumed. Woken up, it must not start a single attempt in
// a partition it lost (the zombie the fencing exists for): its timers fire and its
// workers find their lease lapsed by their own clock. Later it takes a share back
// through the leases, legitimately.
func TestDispatcherPausedPastItsLease(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{interval: 200 * time.Millisecond, noStart: true,
		respond: func(ledger.Arrival) ledger.Response { return ledger.Response{Delay: 50 * time.Millisecond} }})
	env := map[string]string{"NATS_URL": s.srv.ClientURL(), "RAVEN_URL": s.ravenURL, "DISPATCH_INTERVAL": "200ms",
		"LEASE_TTL": "2s", "RAVEN_TIMEOUT": "500ms"}
	a := startProc(t, with(env, "INSTANCE_ID", "a"))
	b := startProc(t, with(env, "INSTANCE_ID", "b"))
	stopFeed := s.feed(32, 10*time.Millisecond)
	sentBy := func(id string, after time.Time) []ledger.Arrival {
		var out []ledger.Arrival
		for _, x := range s.ledger.Arrivals() {
			if x.Header.Get("User-Agent") == "dispatcher/"+id && x.Start.After(after) {
				out = append(out, x)
			}
		}
		return out
	}
	waitFor(t, time.Minute, "both instances sending", func() bool {
		return len(sentBy("a", time.Time{})) > 10 && len(sentBy("b", time.Time{})) > 10
	})
	// Each client's partition, from the subject the stream stores its requests under. (It
	// was read from the queue while the feed kept the client queued; on a loaded machine
	// the feed came slower than the 200 ms spacing drained it, and a minute went by
	// without catching every client queued: seen with 16 tests at a time, 24 of 32.)
	partition := map[string]int{}
	for c := range 32 {
		p, err := request.PartitionOf(s.q.StoredSubject(clientName(c)))
		if err != nil {
			t.Fatal(err)
		}
		partition[clientName(c)] = p
	}
	a.send(syscall.SIGSTOP)
	stoppedAt := time.Now()
	time.Sleep(5 * time.Second) // the pause, past a's 2 s lease: b takes its partitions over
	if len(sentBy("b", stoppedAt.Add(3*time.Second))) == 0 {
		t.Fatal("b sent nothing while a was paused")
	}
	resumedAt := time.Now()
	a.send(syscall.SIGCONT)
	time.Sleep(3 * time.Second)
	// Every attempt a started after it was resumed must be in a partition it acquired
	// again after that, at least an interval after that acquisition. (A stopped process
	// starts nothing: what raven saw of a between the stop and the resume was on the wire
	// at the stop, however late a loaded machine let raven record it.)
	acquired := map[int][]time.Time{}
	for _, a := range acquisitions(a.Output()) {
		if a.at.After(resumedAt) {
			acquired[a.p] = append(acquired[a.p], a.at)
		}
	}
	for _, x := range sentBy("a", resumedAt) {
		p, known := partition[x.ClientID]
		if !known {
			t.Fatalf("a sent for %s, not one of the feed's clients", x.ClientID)
		}
		legit := false
		for _, at := range acquired[p] {
			legit = legit || !x.Start.Before(at.Add(200*time.Millisecond-5*time.Millisecond))
		}
		if !legit {
			t.Errorf("a started an attempt for %s (partition %d) at %s, %s after it was resumed, without having acquired the partition again an interval before",
				x.ClientID, p, x.Start.Format(time.StampMicro), x.Start.Sub(resumedAt))
		}
	}
	stopFeed()
	s.waitDone(60 * time.Second)
	a.signal(syscall.SIGTERM)
	b.signal(syscall.SIGTERM)
	s.checkExplained(a.Output(), b.Output())
}

// The lease store's clock jumps forward: it removes every lease and heartbeat early,
// while their holders still hold them by their own clocks and go on sending. Simulated by
// removing those entries from the lease bucket's stream without a trace, which is what an
// expiry does. Both instances race to take partitions again, and some change hands: the
// new holder must not send there before the old one could have stopped, a TTL after the
// last renewal it saw. (Without that wait this test fails with gaps below the interval.)
func TestLeasesRemovedEarlyByTheStoresClock(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	s := newStack(t, options{interval: 200 * time.Millisecond, noStart: true,
		respond: func(ledger.Arrival) ledger.Response { return ledger.Response{Delay: 20 * time.Millisecond} }})
	env := map[string]string{"NATS_URL": s.srv.ClientURL(), "RAVEN_URL": s.ravenURL, "DISPATCH_INTERVAL": "200ms",
		"LEASE_TTL": ttl.String(), "RAVEN_TIMEOUT": "500ms"}
	const clients = 48
	names := make([]string, clients)
	for c := range clients {
		names[c] = clientName(c)
	}
	for _, n := range names { // queued directly: 2,880 posts through ingest took 3 min beside another CI run
		s.queueDirect(n, 60)
	}
	a := startProc(t, with(env, "INSTANCE_ID", "a"))
	b := startProc(t, with(env, "INSTANCE_ID", "b"))
	leases, err := s.q.Leases(context.Background(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	owners := func() map[int]string {
		o, err := leases.Owners(context.Background())
		if err != nil {
			return nil
		}
		return o
	}
	waitForState(t, time.Minute, "a and b to share the partitions", func() (bool, string) {
		o := owners()
		n := 0
		for _, id := range o {
			if id == "a" {
				n++
			}
		}
		return n == 32 && len(o) == 64, fmt.Sprintf("a holds %d of %d owned", n, len(o))
	})
	// Partitions taken, after the removal, by the instance that did not hold them before.
	// Each round waits until every partition was acquired again.
	moved := 0
	for try := 0; try < 5 && moved == 0; try++ {
		before := owners()
		removedAt := time.Now()
		expireEarly(t, s)
		waitForState(t, time.Minute, "every partition acquired again after the removal", func() (bool, string) {
			again := map[int]bool{}
			for _, p := range []*proc{a, b} {
				for _, a := range acquisitions(p.Output()) {
					if a.at.After(removedAt) {
						again[a.p] = true
					}
				}
			}
			return len(again) == 64, fmt.Sprintf("%d of 64 acquired again", len(again))
		})
		for id, p := range map[string]*proc{"a": a, "b": b} {
			for _, a := range acquisitions(p.Output()) {
				if a.at.After(removedAt) && before[a.p] != id {
					moved++
				}
			}
		}
	}
	if moved == 0 {
		t.Fatal("no partition changed hands after the leases were removed five times")
	}
	t.Logf("%d partitions changed hands", moved)
	s.waitDone(120 * time.Second)
	a.signal(syscall.SIGTERM)
	b.signal(syscall.SIGTERM)
	s.checkExplained(a.Output(), b.Output())
}

// expireEarly removes every lease and heartbeat from the lease bucket's stream as an
// expiry would, without a trace.
func expireEarly(t testing.TB, s *stack) {
	t.Helper()
	if err := queuetest.ExpireLeases(context.Background(), s.nc); err != nil {
		t.Fatal(err)
	}
}

type acquisition struct {
	p  int
	at time.Time
}

// acquisitions reads the partitions a dispatcher logged acquiring, and when, from its
// "partitions acquired" lines (one per round).
func acquisitions(out string) []acquisition {
	var found []acquisition
	for _, l := range logLines(out, "partitions acquired") {
		at, _ := time.Parse(time.RFC3339Nano, l["time"].(string))
		ps, _ := l["partitions"].([]any)
		for _, p := range ps {
			if n, ok := p.(float64); ok {
				found = append(found, acquisition{int(n), at})
			}
		}
	}
	return found
}
