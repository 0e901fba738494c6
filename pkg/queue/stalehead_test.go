package queue_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/fault"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// A NATS server cut off from its cluster that led the request stream goes on answering
// reads as its leader (nats-server steps a leader down only after 10 s without a quorum),
// from its copy of the stream, which misses every removal made since the cut. A
// dispatcher whose connection moves to it (a reconnect, or its own move away from a
// server through which JetStream does not answer) read a delivered request there as its
// client's head and sent it again: the duplicates of the soak on dccf091, which no log
// line explained, since the removal that followed, through a healthy server, found the
// request gone and took that for success.
//
// So a head is read (and a request to cancel found) only through a server a write has
// gone through since the connection last moved: a write needs the stream's quorum, which
// a cut-off server does not have.
func TestAHeadIsNotReadThroughAServerCutOffFromItsCluster(t *testing.T) {
	t.Parallel()
	c := queuetest.NewClusterWith(t, 3, queuetest.ClusterOptions{ProxyRoutes: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	setup := dial(t, c.URL())
	q0, err := queuetest.Open(ctx, setup, queue.Config{Replicas: 3}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	r1 := publish(t, q0, "alice", "r1")
	publish(t, q0, "alice", "r2")
	leader := -1
	waitUntil(t, time.Minute, "a request stream leader", func() bool {
		leader = c.StreamLeader(queue.RequestStream)
		return leader >= 0
	})
	other := (leader + 1) % 3
	// The other side of the cut, for the removal.
	qM := openExisting(t, ctx, dial(t, c.Server(other).ClientURL()))
	// The reader: on the other node through a proxy first, the leader next.
	toOther, err := fault.New(strings.TrimPrefix(c.Server(other).ClientURL(), "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	defer toOther.Close()
	leaderURL := c.Server(leader).ClientURL()
	nc := dial(t, "nats://"+toOther.Addr()+","+leaderURL, nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	qD := openExisting(t, ctx, nc)
	qD.ProveHeadReads()
	go qD.WatchWrites(ctx, 200*time.Millisecond, zerolog.Nop())
	lane, _, _, err := qD.ClientLane(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	head := func() (request.Stored, bool, error) {
		hctx, hcancel := context.WithTimeout(ctx, 5*time.Second)
		defer hcancel()
		return qD.Head(hctx, lane)
	}
	if st, ok, err := head(); err != nil || !ok || st.ID != "r1" {
		t.Fatalf("head before the cut: %q %v %v, want r1", st.ID, ok, err)
	}
	// (Polled: a test write that times out just then withdraws the proof until the next.)
	waitUntil(t, 30*time.Second, "dispatch_queue_link_proven at 1 after a head read", func() bool { return qD.LinkProven() == 1 })

	c.Partition(leader)
	cut := time.Now()
	// A removal whose answer did not come in time may have landed: the next one then
	// answers that r1 is not queued, which is as good (seen in CI under load, where every
	// later removal answered so for the rest of the minute).
	waitUntil(t, time.Minute, "r1 removed through the majority", func() bool {
		dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
		defer dcancel()
		err := qM.Delete(dctx, lane, r1.Seq)
		return err == nil || errors.Is(err, request.ErrNotQueued)
	})
	t.Logf("r1 removed through the majority %s after the cut", time.Since(cut).Round(time.Millisecond))
	toOther.Refuse()
	toOther.ResetAll()
	waitUntil(t, 30*time.Second, "the reader connected to the cut-off node", func() bool {
		return nc.IsConnected() && nc.ConnectedUrl() == leaderURL
	})
	// The cut-off node still holds r1, and still leads the stream in its own view.
	for range 3 {
		st, ok, err := head()
		if ok && st.Seq <= r1.Seq {
			t.Fatalf("head read through the cut-off node: %s (seq %d), which was removed through the majority: it would be sent again", st.ID, st.Seq)
		}
		if err == nil || !errors.Is(err, queue.ErrLinkUnproven) {
			t.Fatalf("head read through the cut-off node: %q %v %v, want the error saying no write went through it", st.ID, ok, err)
		}
		// The cancel's read: finding r1 there, a cancel would answer cancelled for a
		// request raven had.
		fctx, fcancel := context.WithTimeout(ctx, 5*time.Second)
		_, found, err := qD.Find(fctx, lane, "r1")
		fcancel()
		if found || !errors.Is(err, queue.ErrLinkUnproven) {
			t.Fatalf("finding r1 through the cut-off node: found %v, %v; want the error saying no write went through it", found, err)
		}
		if v := qD.LinkProven(); v != 0 {
			t.Fatalf("dispatch_queue_link_proven = %v on the cut-off node, want 0", v)
		}
	}
	c.Heal(leader)
	waitUntil(t, 2*time.Minute, "r2 as the head once the node is back", func() bool {
		st, ok, err := head()
		if ok && st.Seq <= r1.Seq {
			t.Fatalf("head read after the heal: %s (seq %d), removed already", st.ID, st.Seq)
		}
		return err == nil && ok && st.ID == "r2"
	})
	waitUntil(t, 30*time.Second, "dispatch_queue_link_proven at 1 after the heal", func() bool { return qD.LinkProven() == 1 })
}

func dial(t *testing.T, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.Timeout(queuetest.DialTimeout)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func openExisting(t *testing.T, ctx context.Context, nc *nats.Conn) *queue.Queue {
	t.Helper()
	q, err := queue.Open(ctx, nc, queue.Config{Replicas: 3}, queue.Existing)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
