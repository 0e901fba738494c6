package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
)

// The test write passes on a healthy store, single server and cluster alike, and never
// removes a request. (That it fails on a store that cannot write is shown end to end by
// the integration disk tests.)
func TestProbeWriteOnAHealthyStore(t *testing.T) {
	t.Parallel()
	single := open(t, queue.Config{})
	cluster := queuetest.NewCluster(t, 3)
	nc, err := nats.Connect(cluster.URL(), nats.Timeout(queuetest.DialTimeout))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clustered, err := queuetest.Open(ctx, nc, queue.Config{Replicas: 3}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatalf("opening the queue on the cluster: %v", err)
	}
	for name, q := range map[string]*queue.Queue{"single": single, "cluster": clustered} {
		publish(t, q, "alice", "r1")
		for range 3 {
			if err := q.ProbeWrite(); err != nil {
				t.Fatalf("%s: test write on a healthy store: %v", name, err)
			}
		}
		st, err := q.Stats(context.Background())
		if err != nil || st.Requests != 1 {
			t.Fatalf("%s: %d requests after the test writes (%v), want the one published", name, st.Requests, err)
		}
		if err := q.WriteErr(); err != nil {
			t.Fatalf("%s: WriteErr %v", name, err)
		}
	}
}
