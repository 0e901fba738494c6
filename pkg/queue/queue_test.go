package queue_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

func open(t testing.TB, cfg queue.Config) *queue.Queue {
	t.Helper()
	s := queuetest.Server(t)
	q, err := queue.Open(context.Background(), queuetest.Conn(t, s), cfg, queue.CreateOrUpdate)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return q
}

func publish(t testing.TB, q *queue.Queue, client, id string) request.Receipt {
	t.Helper()
	res, err := q.Publish(context.Background(), request.Request{ID: id, ClientID: client, ContentType: "application/json", Body: []byte(`{"n":"` + id + `"}`)})
	if err != nil {
		t.Fatalf("publish %s/%s: %v", client, id, err)
	}
	return res
}

func TestHeadDeleteInOrder(t *testing.T) {
	t.Parallel()
	q := open(t, queue.Config{})
	ctx := context.Background()
	for i := range 3 {
		publish(t, q, "alice", fmt.Sprint("a", i))
	}
	publish(t, q, "bob", "b0")

	backlog, err := q.Backlog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(backlog) != 2 {
		t.Fatalf("backlog has %d subjects, want 2: %v", len(backlog), backlog)
	}
	var alice request.Lane
	for subj, n := range backlog {
		if id, _ := request.ClientIDOf(subj); id == "alice" {
			alice, _ = request.LaneOf(subj)
			if n != 3 {
				t.Fatalf("alice has %d queued, want 3", n)
			}
		}
		if p, err := request.PartitionOf(subj); err != nil || p < 0 || p >= queue.DefaultPartitions {
			t.Fatalf("partition of %s = %d, %v", subj, p, err)
		}
	}
	for i := range 3 {
		st, ok, err := q.Head(ctx, alice)
		if err != nil || !ok {
			t.Fatalf("head %d: ok=%v err=%v", i, ok, err)
		}
		if want := fmt.Sprint("a", i); st.ID != want || st.ClientID != "alice" || string(st.Body) != `{"n":"`+want+`"}` || st.ContentType != "application/json" {
			t.Fatalf("head %d = %+v, want id %s", i, st, want)
		}
		if err := q.Delete(ctx, st.Lane, st.Seq); err != nil {
			t.Fatal(err)
		}
		if err := q.Delete(ctx, st.Lane, st.Seq); !errors.Is(err, request.ErrNotQueued) {
			t.Fatalf("deleting twice: %v, want request.ErrNotQueued", err)
		}
	}
	if _, ok, err := q.Head(ctx, alice); ok || err != nil {
		t.Fatalf("head of drained subject: ok=%v err=%v", ok, err)
	}
}

// Deleting a request that is already gone answers request.ErrNotQueued wherever it was in
// the stream, never a failure: a removal whose answer was lost is retried, and two
// instances may both remove a request during a takeover. The server answers differently
// for the first message ("no message found") and for one in the middle ("sequence not
// found"); a dispatcher that took the latter for a failure retried the removal for ever.
func TestDeleteTwiceAnywhere(t *testing.T) {
	t.Parallel()
	q := open(t, queue.Config{})
	ctx := context.Background()
	var seqs []uint64
	for i := range 5 {
		seqs = append(seqs, publish(t, q, "alice", fmt.Sprint("a", i)).Seq)
	}
	lane, _, _, err := q.ClientLane(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	for _, seq := range []uint64{seqs[2], seqs[0], seqs[4]} {
		if err := q.Delete(ctx, lane, seq); err != nil {
			t.Fatalf("deleting sequence %d: %v", seq, err)
		}
		// The dispatcher takes this answer for a removal that landed (on a retry) or for
		// a request removed before its attempt (on a first try), never for a failure.
		if err := q.Delete(ctx, lane, seq); !errors.Is(err, request.ErrNotQueued) {
			t.Fatalf("deleting sequence %d again: %v, want request.ErrNotQueued", seq, err)
		}
	}
}

func TestHostileClientIDsStayApart(t *testing.T) {
	t.Parallel()
	q := open(t, queue.Config{})
	ids := []string{"a.b", "a", "*", ">", "a.>", "a b", "日本", "a.*", "ä"}
	for i, id := range ids {
		publish(t, q, id, fmt.Sprint("r", i))
	}
	backlog, err := q.Backlog(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for subj, n := range backlog {
		id, err := request.ClientIDOf(subj)
		if err != nil {
			t.Fatal(err)
		}
		if n != 1 || strings.Count(subj, ".") != 3 {
			t.Fatalf("subject %s (client %q) holds %d, want 1 in 4 tokens", subj, id, n)
		}
		seen[id] = true
	}
	for _, id := range ids {
		if !seen[id] {
			t.Errorf("client %q not found in %v", id, backlog)
		}
	}
}

func TestBacklogCapAndDuplicates(t *testing.T) {
	t.Parallel()
	q := open(t, queue.Config{BacklogCap: 2})
	first := publish(t, q, "c", "x1")
	if again := publish(t, q, "c", "x1"); !again.Duplicate || again.Seq != first.Seq {
		t.Fatalf("same id again: %+v, want duplicate of seq %d", again, first.Seq)
	}
	publish(t, q, "c", "x2")
	_, err := q.Publish(context.Background(), request.Request{ID: "x3", ClientID: "c", Body: []byte("{}")})
	if !errors.Is(err, request.ErrBacklogFull) {
		t.Fatalf("third publish: %v, want request.ErrBacklogFull", err)
	}
	publish(t, q, "other", "o1") // another client is not affected
}

func TestQueueFull(t *testing.T) {
	t.Parallel()
	q := open(t, queue.Config{MaxBytes: 4096})
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		_, err = q.Publish(context.Background(), request.Request{ID: fmt.Sprint(i), ClientID: fmt.Sprint("c", i), Body: make([]byte, 512)})
	}
	if !errors.Is(err, request.ErrQueueFull) {
		t.Fatalf("publishing past MaxBytes: %v, want request.ErrQueueFull", err)
	}
}

func TestDeadLetterKeepsOneCopy(t *testing.T) {
	t.Parallel()
	q := open(t, queue.Config{})
	ctx := context.Background()
	publish(t, q, "d", "id1")
	backlog, _ := q.Backlog(ctx)
	for subj := range backlog {
		lane, _ := request.LaneOf(subj)
		st, _, err := q.Head(ctx, lane)
		if err != nil {
			t.Fatal(err)
		}
		why := request.Verdict{Reason: request.ReasonPermanent, LastStatus: 400, Attempts: 1, LastError: "bad\r\nthing"}
		for range 2 {
			if err := q.AddDeadLetter(ctx, st, why); err != nil {
				t.Fatal(err)
			}
		}
	}
	dead := deadLetters(t, q, queue.DeadFilter{})
	if len(dead) != 1 || dead[0].ID != "id1" || dead[0].Reason != request.ReasonPermanent || dead[0].LastStatus != 400 || dead[0].ClientID != "d" {
		t.Fatalf("dead letters = %+v, want one permanent 400 for id1", dead)
	}
}

func TestPartitionCountIsFixed(t *testing.T) {
	t.Parallel()
	s := queuetest.Server(t)
	nc := queuetest.Conn(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := queue.Open(ctx, nc, queue.Config{Partitions: 8}, queue.CreateOrUpdate); err != nil {
		t.Fatal(err)
	}
	_, err := queue.Open(ctx, nc, queue.Config{Partitions: 16}, queue.CreateOrUpdate)
	if err == nil || !strings.Contains(err.Error(), "partition") {
		t.Fatalf("reopening with another partition count: %v, want an error naming partitions", err)
	}
}

// The holding steps run on a bucket whose TTL (30 s) no step of a loaded machine
// outlasts; expiry is TestUnrenewedLeasesExpire's.
func TestLeases(t *testing.T) {
	t.Parallel()
	q := open(t, queue.Config{})
	ctx := context.Background()
	l, err := q.Leases(ctx, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Leases(ctx, time.Minute); err == nil || !strings.Contains(err.Error(), "LEASE_TTL") {
		t.Fatalf("opening the lease bucket with another TTL: %v, want a refusal naming LEASE_TTL", err)
	}
	rev, ok, err := l.Acquire(ctx, 3, "a")
	if err != nil || !ok {
		t.Fatalf("acquire a free partition: ok=%v err=%v", ok, err)
	}
	if _, ok, err := l.Acquire(ctx, 3, "b"); ok || err != nil {
		t.Fatalf("acquire a held partition: ok=%v err=%v, want refused", ok, err)
	}
	rev2, ok, err := l.Renew(ctx, 3, "a", rev)
	if err != nil || !ok {
		t.Fatalf("renew: ok=%v err=%v", ok, err)
	}
	if _, ok, err := l.Renew(ctx, 3, "a", rev); ok || err != nil {
		t.Fatalf("renew with a stale revision: ok=%v err=%v, want lost", ok, err)
	}
	released := make(chan struct{}, 1)
	stop, err := l.WatchLeases(ctx, func(c request.LeaseChange) {
		if !c.Heartbeat && c.Partition == 3 && c.Released {
			select {
			case released <- struct{}{}:
			default:
			}
		}
	}, func(err error) { t.Errorf("lease watch lost: %v", err) })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := l.Release(ctx, 3, rev2); err != nil {
		t.Fatal(err)
	}
	select {
	case <-released:
	case <-time.After(30 * time.Second):
		t.Fatal("no release of partition 3 seen by the watch within 30 s")
	}
	if _, ok, err := l.Acquire(ctx, 3, "b"); !ok || err != nil {
		t.Fatalf("acquire a released partition: ok=%v err=%v", ok, err)
	}
	if err := l.Heartbeat(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if m, err := l.Members(ctx); err != nil || len(m) != 1 || m[0] != "a" {
		t.Fatalf("members %v, %v", m, err)
	}
}

// A lease nobody renews, and a heartbeat not repeated, expire with the bucket's TTL (1 s
// here): another instance may take the partition then, and the instance is no member.
func TestUnrenewedLeasesExpire(t *testing.T) {
	t.Parallel()
	q := open(t, queue.Config{})
	ctx := context.Background()
	l, err := q.Leases(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := l.Acquire(ctx, 4, "a"); !ok || err != nil {
		t.Fatalf("acquire 4: ok=%v err=%v", ok, err)
	}
	if err := l.Heartbeat(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	taken := false
	for {
		var err error
		if !taken {
			_, taken, err = l.Acquire(ctx, 4, "b")
		}
		m, merr := l.Members(ctx)
		if taken && len(m) == 0 && merr == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after a lease and a heartbeat with a TTL of 1 s: b acquired %v (%v), members %v (%v); want the lease taken and no members",
				taken, err, m, merr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestClusterR3(t *testing.T) {
	t.Parallel()
	c := queuetest.NewCluster(t, 3)
	nc, err := nats.Connect(c.URL(), nats.Timeout(queuetest.DialTimeout), nats.ReconnectWait(100*time.Millisecond), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx := context.Background()
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	q, err := queuetest.Open(octx, nc, queue.Config{Replicas: 3}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	publish(t, q, "a", "1")
	leader := c.StreamLeader(queue.RequestStream)
	if leader < 0 {
		t.Fatal("no stream leader")
	}
	c.Stop(leader)
	deadline := time.Now().Add(60 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := q.Publish(pctx, request.Request{ID: "2", ClientID: "a", Body: []byte("{}")})
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no publish after the leader stopped: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	backlog, err := q.Backlog(ctx)
	if err != nil || len(backlog) != 1 {
		t.Fatalf("backlog %v %v", backlog, err)
	}
	for _, n := range backlog {
		if n != 2 {
			t.Fatalf("client a has %d queued after the leader change, want 2", n)
		}
	}
}

func TestStoredSubjectIsTheServers(t *testing.T) {
	t.Parallel()
	for _, partitions := range []int{1, 7, 64} {
		q := open(t, queue.Config{Partitions: partitions})
		for i := range 50 {
			id := fmt.Sprintf("client-%d-%s", i, strings.Repeat("x", i))
			publish(t, q, id, fmt.Sprint("r", i))
			lane, _, ok, err := q.ClientLane(context.Background(), id)
			if err != nil || !ok {
				t.Fatalf("client %s: %v %v", id, ok, err)
			}
			head, _, err := q.Head(context.Background(), lane)
			if err != nil {
				t.Fatal(err)
			}
			if got, subj := q.StoredSubject(id), head.Subject; got != subj || lane.Subject() != subj { // head.Subject: the server's
				t.Fatalf("%d partitions, client %s: StoredSubject %s, the server stored it under %s", partitions, id, got, subj)
			}
		}
	}
}

// Validate refuses what the server would refuse: a status retention or a dead-letter age
// shorter than the duplicate window (a stream's duplicate window may not outlast its
// messages), with a detail that names both; at the window itself both are accepted.
func TestValidateRefusesWhatTheServerWould(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		cfg     queue.Config
		refused string
	}{
		{"StatusRetentionBelowTheWindow", queue.Config{StatusRetention: time.Minute}, "status retention 1m0s: must be at least the duplicate window (2m0s)"},
		{"DeadLetterAgeBelowTheWindow", queue.Config{DeadLetterMaxAge: time.Minute}, "dead-letter max age 1m0s: must be 0 (forever) or at least the duplicate window (2m0s)"},
		{"AtTheWindow", queue.Config{StatusRetention: 2 * time.Minute, DeadLetterMaxAge: 2 * time.Minute}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, s := tc.cfg, queuetest.Server(t)
			err := cfg.WithDefaults().Validate()
			if tc.refused == "" {
				if err != nil {
					t.Fatalf("Validate: %v, want accepted", err)
				}
				if _, err := queue.Open(context.Background(), queuetest.Conn(t, s), cfg, queue.CreateOrUpdate); err != nil {
					t.Fatalf("accepted by Validate, refused by the server: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.refused) {
				_, openErr := queue.Open(context.Background(), queuetest.Conn(t, s), cfg, queue.CreateOrUpdate)
				t.Fatalf("Validate: %v, want %q (the server says: %v)", err, tc.refused, openErr)
			}
		})
	}
}
