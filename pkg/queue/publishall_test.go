package queue_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

func batchOf(n int, client func(i int) string) []request.Request {
	rs := make([]request.Request, n)
	t0 := time.Now()
	for i := range rs {
		rs[i] = request.Request{ID: request.NewID(t0.Add(time.Duration(i) * time.Millisecond)), ClientID: client(i),
			ContentType: "application/json", Body: fmt.Appendf(nil, `{"n":%d}`, i)}
	}
	return rs
}

// checkStored says that each request stored has its receipt's sequence in the request
// stream, and that stream message is that request.
func checkStored(t *testing.T, js jetstream.JetStream, rs []request.Request, receipts []request.Receipt, errs []error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, queue.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rs {
		if errs[i] != nil {
			continue
		}
		m, err := stream.GetMsg(ctx, receipts[i].Seq)
		if err != nil {
			t.Fatalf("request %d: its receipt's sequence %d: %v", i, receipts[i].Seq, err)
		}
		if got := m.Header.Get(request.HeaderID); got != r.ID || string(m.Data) != string(r.Body) {
			t.Fatalf("request %d: sequence %d holds %s %s, want %s %s", i, receipts[i].Seq, got, m.Data, r.ID, r.Body)
		}
	}
}

// A batch is stored whole, each request at the sequence its receipt gives, whichever
// way PublishAll takes; a batch the server refuses as a whole when sent atomically (a
// request sent before, a client over its backlog cap) still gets an answer for each
// request, as publishes one by one give.
func TestPublishAllAnswersEachRequest(t *testing.T) {
	t.Parallel()
	for _, atomic := range []bool{true, false} {
		t.Run(fmt.Sprintf("atomic=%v", atomic), func(t *testing.T) {
			t.Parallel()
			publishAllAnswersEachRequest(t, atomic)
		})
	}
}

func publishAllAnswersEachRequest(t *testing.T, atomic bool) {
	nc := queuetest.Conn(t, queuetest.Server(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q, err := queue.Open(ctx, nc, queue.Config{BacklogCap: 3}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	q.PreferBatches(atomic)
	js, _ := jetstream.New(nc)
	rs := batchOf(20, func(i int) string { return fmt.Sprintf("c%d", i%8) })
	receipts, errs := q.PublishAll(ctx, rs)
	for i := range rs {
		if errs[i] != nil || receipts[i].Duplicate {
			t.Fatalf("request %d: %+v %v, want stored", i, receipts[i], errs[i])
		}
	}
	checkStored(t, js, rs, receipts, errs)

	// One request sent before: it is the duplicate, the rest are stored.
	rs = batchOf(20, func(i int) string { return fmt.Sprintf("d%d", i) })
	first, err := q.Publish(ctx, rs[7])
	if err != nil {
		t.Fatal(err)
	}
	receipts, errs = q.PublishAll(ctx, rs)
	for i := range rs {
		switch {
		case errs[i] != nil:
			t.Fatalf("request %d: %v", i, errs[i])
		case i == 7 && (!receipts[i].Duplicate || receipts[i].Seq != first.Seq):
			t.Fatalf("the request sent before: %+v, want a duplicate of sequence %d", receipts[i], first.Seq)
		case i != 7 && receipts[i].Duplicate:
			t.Fatalf("request %d taken for a duplicate", i)
		}
	}
	checkStored(t, js, rs, receipts, errs)

	// Five requests of one client over a cap of three: the last two are refused, the rest
	// are stored.
	rs = batchOf(20, func(i int) string {
		if i < 5 {
			return "full"
		}
		return fmt.Sprintf("e%d", i)
	})
	receipts, errs = q.PublishAll(ctx, rs)
	for i := range rs {
		full := i == 3 || i == 4
		if full != errors.Is(errs[i], request.ErrBacklogFull) || !full && errs[i] != nil {
			t.Fatalf("request %d: %v (backlog full expected: %v)", i, errs[i], full)
		}
	}
	checkStored(t, js, rs, receipts, errs)
}
