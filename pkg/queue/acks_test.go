package queue_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// A publish made without waiting whose acknowledgement never comes, the connection up all
// along, fails as request.ErrUnavailable within the queue's ack timeout and gives its slot back
// to the pool of pending publishes, instead of holding it for good. Here the server the
// queue is connected to is cut off from the rest of its cluster: it keeps its clients
// and takes their publishes, but no stream answers them.
func TestUnansweredPublishesTimeOut(t *testing.T) {
	t.Parallel()
	c := queuetest.NewClusterWith(t, 3, queuetest.ClusterOptions{ProxyRoutes: true})
	c.WaitForMetaLeader()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	setup, err := nats.Connect(c.URL(), nats.Timeout(queuetest.DialTimeout))
	if err != nil {
		t.Fatal(err)
	}
	defer setup.Close()
	if _, err := queuetest.Open(ctx, setup, queue.Config{Replicas: 3}, queue.CreateOrUpdate); err != nil {
		t.Fatal(err)
	}
	// A follower of the request stream: it drops the publishes it cannot forward.
	leader := c.StreamLeader(queue.RequestStream)
	for deadline := time.Now().Add(10 * time.Second); leader < 0; leader = c.StreamLeader(queue.RequestStream) {
		if time.Now().After(deadline) {
			t.Fatal("no request stream leader within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	node := (leader + 1) % 3
	nc, err := nats.Connect(c.Server(node).ClientURL(), nats.Timeout(queuetest.DialTimeout), nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	q, err := queuetest.Open(ctx, nc, queue.Config{Replicas: 3}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	c.Partition(node)
	t.Cleanup(func() { c.Heal(node) })
	// Should leadership have moved to the node meanwhile, it steps down once it finds
	// itself alone: from then on nothing there answers a publish.
	for deadline := time.Now().Add(20 * time.Second); c.Server(node).JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, queue.RequestStream); {
		if time.Now().After(deadline) {
			t.Fatal("the cut-off node still leads the request stream after 20s")
		}
		time.Sleep(50 * time.Millisecond)
	}

	rs := make([]request.Request, 10)
	for i := range rs {
		rs[i] = request.Request{ID: fmt.Sprintf("r%d", i), ClientID: "alice", Body: []byte("{}")}
	}
	// The caller's deadline is far past the queue's ack timeout (5s by default), so that
	// a loaded machine cannot mistake one for the other: a publish cut short by the
	// caller's deadline fails with the context's error, not the ack timeout's.
	wait := 30 * time.Second
	pctx, pcancel := context.WithTimeout(context.Background(), wait)
	defer pcancel()
	began := time.Now()
	_, errs := q.PublishAll(pctx, rs)
	took := time.Since(began)
	t.Logf("PublishAll gave up after %s", took)
	for i, err := range errs {
		if !errors.Is(err, request.ErrUnavailable) || !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
			t.Errorf("request %d after %s: %v, want request.ErrUnavailable for an acknowledgement timed out", i, took, err)
			break
		}
	}
	if took >= wait {
		t.Errorf("PublishAll took %s: it waited out the caller's deadline, not the queue's ack timeout", took)
	}
	if n := q.PendingPublishes(); n != 0 {
		t.Errorf("%d publishes still pending after PublishAll gave up on them, want 0", n)
	}
	if !nc.IsConnected() {
		t.Fatal("the connection dropped: the test did not show acknowledgements lost on a live connection")
	}
}
