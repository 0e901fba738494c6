package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/penguinhq/dispatcher/pkg/ledger"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// clusterStack is a stack on an in-process 3-node JetStream cluster with R3 streams, and
// dispatchers run as separate processes.
type clusterStack struct {
	*stack
	cluster *queuetest.Cluster
	leases  *queue.Leases
	env     map[string]string
}

// The cluster stack's dispatchers: a lease TTL and a send timeout of seconds, so that a
// stall of a loaded machine neither moves leases mid-test nor turns a prompt answer into a
// duplicate. Tests of how fast a takeover is judge against the bound these give.
const (
	clusterLeaseTTL     = 6 * time.Second
	clusterRavenTimeout = 3 * time.Second
)

func newClusterStack(t testing.TB, o options) *clusterStack {
	t.Helper()
	return newClusterStackWith(t, o, queuetest.ClusterOptions{})
}

// newClusterStackWith is newClusterStack on a cluster built with co.
func newClusterStackWith(t testing.TB, o options, co queuetest.ClusterOptions) *clusterStack {
	t.Helper()
	c := queuetest.NewClusterWith(t, 3, co)
	o.natsURL = c.URL()
	o.queue.Replicas = 3
	o.noStart = true
	s := newStack(t, o)
	if o.leaseTTL == 0 {
		o.leaseTTL = clusterLeaseTTL
	}
	// As the binaries do: a bucket's placement refused for want of a peer that a loaded
	// cluster counts offline for a moment is tried again.
	var leases *queue.Leases
	waitForState(t, time.Minute, "the lease bucket", func() (bool, string) {
		var err error
		leases, err = s.q.Leases(context.Background(), o.leaseTTL)
		if err != nil && !queue.IsNoPeers(err) && !queue.IsTransient(err) {
			t.Fatal(err)
		}
		return err == nil, fmt.Sprint(err)
	})
	return &clusterStack{stack: s, cluster: c, leases: leases, env: map[string]string{
		"NATS_URL": c.URL(), "STREAM_REPLICAS": "3", "RAVEN_URL": s.ravenURL,
		"DISPATCH_INTERVAL": s.opts.interval.String(), "LEASE_TTL": o.leaseTTL.String(), "RAVEN_TIMEOUT": clusterRavenTimeout.String(),
		"RETRY_BACKOFF_BASE": "100ms", "RETRY_BACKOFF_MAX": "1s", "MAX_ATTEMPTS": "1000",
	}}
}

func (c *clusterStack) startDispatcher(id string) *proc {
	env := map[string]string{"INSTANCE_ID": id}
	for k, v := range c.env {
		env[k] = v
	}
	return startProc(c.t, env)
}

// replicasCurrent counts the nodes that hold a current copy of the request stream.
func (c *clusterStack) replicasCurrent() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	p, _ := c.q.RequestPlacement(ctx)
	return p.Current
}

// watchesSplit says whether the request stream has n watches of new requests whose
// partitions do not overlap and are, together, all partitions.
func (c *clusterStack) watchesSplit(n, partitions int) bool {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	js, err := jetstream.New(c.nc)
	if err != nil {
		c.t.Fatal(err)
	}
	str, err := js.Stream(ctx, queue.RequestStream)
	if err != nil {
		return false
	}
	watches, seen := 0, map[string]bool{}
	for ci := range str.ListConsumers(ctx).Info() {
		f := ci.Config.FilterSubjects
		if ci.Config.FilterSubject != "" {
			f = append(f, ci.Config.FilterSubject)
		}
		if !slices.ContainsFunc(f, func(subj string) bool { return strings.HasSuffix(subj, ".*") || strings.HasSuffix(subj, ">") }) {
			continue // a cancel's search of one client's queue, say
		}
		watches++
		for _, subj := range f {
			if seen[subj] || subj == request.RequestPrefix+">" {
				return false
			}
			seen[subj] = true
		}
	}
	return watches == n && len(seen) == partitions
}

// owners counts the partitions each instance holds.
func (c *clusterStack) owners() map[string]int {
	c.t.Helper()
	owners, err := c.leases.Owners(context.Background())
	if err != nil {
		return nil // a node may be down; callers poll
	}
	counts := map[string]int{}
	for _, id := range owners {
		counts[id]++
	}
	return counts
}

// Several dispatcher processes share the partitions evenly through leases; one is killed
// with SIGKILL mid-run, another starts, one stops gracefully. At the end nothing is lost,
// order held, no gap fell below the interval, and duplicates stayed within the crash
// window (G2-G5 across failover).
func TestDispatchersShareAndFailOver(t *testing.T) {
	t.Parallel()
	c := newClusterStack(t, options{interval: 250 * time.Millisecond,
		respond: func(ledger.Arrival) ledger.Response { return ledger.Response{Delay: 30 * time.Millisecond} }})
	const clients = 40
	for i := range clients {
		for n := range 3 {
			c.post(clientName(i), n)
		}
	}
	a := c.startDispatcher("a")
	b := c.startDispatcher("b")
	waitFor(t, 2*time.Minute, "two instances to hold 32 partitions each", func() bool {
		o := c.owners()
		return o["a"] == 32 && o["b"] == 32
	})
	stopFeed := c.feed(clients, 20*time.Millisecond)
	// Each instance's watch of new requests covers its own 32 partitions (ADR 16): the
	// server sends each request to its owner only.
	waitFor(t, time.Minute, "two watches of 32 partitions each, together all 64", func() bool {
		return c.watchesSplit(2, 64)
	})

	waitFor(t, time.Minute, "deliveries", func() bool { return c.ledger.Delivered() >= clients })
	a.signal(syscall.SIGKILL)
	c.startDispatcher("c")
	waitFor(t, time.Minute, "b and c to share every partition after a's leases expired", func() bool {
		o := c.owners()
		return o["a"] == 0 && o["b"] == 32 && o["c"] == 32
	})
	// b stops gracefully and hands its partitions back: c takes them at once, well before
	// b's leases would have expired.
	b.signal(syscall.SIGTERM)
	if code := b.ExitCode(); code != 0 {
		t.Fatalf("b exited %d on SIGTERM", code)
	}
	if o := c.owners(); o["b"] != 0 {
		t.Fatalf("b still holds %d leases after a graceful stop, want them handed back: %v", o["b"], o)
	}
	waitFor(t, time.Minute, "c to hold every partition", func() bool { return c.owners()["c"] == 64 })
	stopFeed()
	rep := c.finish(60*time.Second, clients)
	t.Logf("accepted %d", c.acceptedCount())
	if rep.Delivered < clients*3 {
		t.Fatalf("delivered %d", rep.Delivered)
	}
}

// The NATS node leading the request stream dies mid-run: ingest answers 202 or 503 with
// Retry-After (never a 202 that is then lost), and dispatch resumes once a new leader is
// elected. The node comes back later and the run ends clean.
func TestStreamLeaderLoss(t *testing.T) {
	t.Parallel()
	c := newClusterStack(t, options{interval: 200 * time.Millisecond})
	const clients = 24
	c.startDispatcher("a")
	c.startDispatcher("b")
	stopFeed := c.feed(clients, 20*time.Millisecond)
	waitFor(t, time.Minute, "deliveries before the fault", func() bool { return c.ledger.Delivered() >= 20 })

	leader := c.cluster.StreamLeader(queue.RequestStream)
	if leader < 0 {
		t.Fatal("no request stream leader")
	}
	c.cluster.Stop(leader)
	killedAt := time.Now()
	waitFor(t, 60*time.Second, "deliveries after the leader died", func() bool {
		for _, a := range c.ledger.Arrivals() {
			if a.Start.After(killedAt.Add(time.Second)) {
				return true
			}
		}
		return false
	})
	acceptedAtKill := c.acceptedCount()
	waitFor(t, time.Minute, "requests accepted after the leader died", func() bool { return c.acceptedCount() > acceptedAtKill+10 })
	c.cluster.Start(leader)
	// Load goes on after the recovery, and is taken.
	more := c.acceptedCount()
	waitFor(t, time.Minute, "more requests accepted after the recovery", func() bool { return c.acceptedCount() >= more+20 })
	stopFeed()
	rep := c.finish(90*time.Second, clients)
	if rep.Delivered != c.acceptedCount() {
		t.Fatalf("delivered %d of %d accepted", rep.Delivered, c.acceptedCount())
	}
}
