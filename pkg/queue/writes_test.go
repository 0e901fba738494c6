package queue_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/fault"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// The test write passes on a healthy store, single server and cluster alike, both the
// dispatcher's (a removal from the request stream) and ingest's (a marker in the health
// stream), and never removes a request. (That the removal fails on a store that cannot
// write is shown end to end by the integration disk tests; the marker, below.)
func TestProbeWriteOnAHealthyStore(t *testing.T) {
	t.Parallel()
	s := queuetest.Server(t)
	cluster := queuetest.NewCluster(t, 3)
	nc, err := nats.Connect(cluster.URL(), nats.Timeout(queuetest.DialTimeout))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opens := map[string]func(queue.Config) (*queue.Queue, error){
		"single": func(cfg queue.Config) (*queue.Queue, error) {
			return queue.Open(ctx, queuetest.Conn(t, s), cfg, queue.CreateOrUpdate)
		},
		"cluster": func(cfg queue.Config) (*queue.Queue, error) {
			cfg.Replicas = 3
			return queuetest.Open(ctx, nc, cfg, queue.CreateOrUpdate)
		},
	}
	for name, open := range opens {
		dispatcher, err := open(queue.Config{})
		if err != nil {
			t.Fatalf("%s: opening the queue: %v", name, err)
		}
		ingest, err := open(queue.Config{HealthRole: queue.RoleIngest})
		if err != nil {
			t.Fatalf("%s: opening the queue as ingest: %v", name, err)
		}
		publish(t, dispatcher, "alice", "r1")
		for _, q := range []*queue.Queue{dispatcher, ingest} {
			for range 3 {
				if err := q.ProbeWrite(); err != nil {
					t.Fatalf("%s: test write on a healthy store: %v", name, err)
				}
			}
			if err := q.WriteErr(); err != nil {
				t.Fatalf("%s: WriteErr %v", name, err)
			}
		}
		st, err := dispatcher.Stats(context.Background())
		if err != nil || st.Requests != 1 {
			t.Fatalf("%s: %d requests after the test writes (%v), want the one published", name, st.Requests, err)
		}
		// Ingest's markers: the newest only, on its own subject.
		js, _ := jetstream.New(map[string]*nats.Conn{"single": queuetest.Conn(t, s), "cluster": nc}[name])
		hs, err := js.Stream(ctx, queue.HealthStream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := hs.Info(ctx, jetstream.WithSubjectFilter(">"))
		if err != nil || info.State.Msgs != 1 || info.State.Subjects[queue.HealthSubject(queue.RoleIngest)] != 1 {
			t.Fatalf("%s: the health stream holds %d markers on %v (%v), want ingest's newest", name, info.State.Msgs, info.State.Subjects, err)
		}
		if info.Config.Replicas != map[string]int{"single": 1, "cluster": 3}[name] {
			t.Errorf("%s: the health stream has %d replicas, want the request stream's", name, info.Config.Replicas)
		}
	}
}

// Ingest's test write finds a store that cannot write, and finds it again once it can:
// the server's store on a small file system that fills up, its guard restarting it once
// the space comes back (as the standalone and natsnode run it). The marker is a page:
// smaller ones went on being stored in the room left in the file's last page.
func TestHealthWriteSeesAFullDisk(t *testing.T) {
	t.Parallel()
	if !fault.CanMount() {
		t.Skip("skipped: mounting a small tmpfs to fill its disk needs root on Linux (CI runs as root)")
	}
	dir := t.TempDir()
	if err := fault.MountTmpfs(dir, 48<<20); err != nil {
		t.Skipf("skipped: cannot mount a tmpfs (%v); CI runs as root where it can", err)
	}
	t.Cleanup(func() { _ = fault.Unmount(dir) })
	n := queuetest.GuardedServerAt(t, dir, "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	nc := dial(t, n.Server().ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	q, err := queue.Open(ctx, nc, queue.Config{HealthRole: queue.RoleIngest, NoEvents: true}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	publish(t, q, "alice", "r1")
	if err := q.ProbeWrite(); err != nil {
		t.Fatalf("test write on a healthy store: %v", err)
	}

	release, err := fault.FillDisk(dir)
	if err != nil {
		t.Fatal(err)
	}
	// At once: the first test write after the disk filled (three, to allow for a write
	// the page cache still took), where a marker smaller than a page went on being stored
	// for dozens of them.
	var failed error
	for range 3 {
		if failed = q.ProbeWrite(); failed != nil {
			break
		}
	}
	if failed == nil || !strings.Contains(failed.Error(), queue.HealthStream) || !strings.Contains(failed.Error(), "no space left") {
		t.Fatalf("the test writes on a full disk: %v, want the health stream's failed write", failed)
	}
	go q.WatchWrites(ctx, 100*time.Millisecond, zerolog.Nop())
	waitUntil(t, time.Minute, "WriteErr to say the store does not take writes", func() bool { return q.WriteErr() != nil })
	if err := release(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, "WriteErr to say the store takes writes again", func() bool { return q.WriteErr() == nil })
	if n.Guard.Restarts() < 1 {
		t.Error("the guard did not restart the server: the store never failed")
	}
	st, err := q.Stats(ctx)
	if err != nil || st.Requests != 1 {
		t.Fatalf("%d requests after the fault (%v), want the one published", st.Requests, err)
	}
}

// No message that ingest (or anyone) may publish removes queued work through the
// streams' settings: none of the streams the services write to takes a rollup (which
// purges a subject or the stream), a per-message TTL or a schedule (which can roll up a
// subject), and a full request or dead-letter stream refuses the new message instead of
// dropping the oldest. Such messages are refused, and the queued request is still there.
func TestNoPublishDropsQueuedWork(t *testing.T) {
	t.Parallel()
	nc, q := openOnServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, _ := jetstream.New(nc)
	for _, name := range []string{queue.RequestStream, queue.DeadLetterStream, queue.EventStream, queue.HealthStream} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		c := s.CachedInfo().Config
		if c.AllowRollup || c.AllowMsgTTL || c.AllowMsgSchedules || c.AllowMsgCounter || c.SubjectDeleteMarkerTTL != 0 {
			t.Errorf("stream %s allows rollups %v, per-message TTLs %v, schedules %v, counters %v, delete markers %v: want none",
				name, c.AllowRollup, c.AllowMsgTTL, c.AllowMsgSchedules, c.AllowMsgCounter, c.SubjectDeleteMarkerTTL)
		}
		if (name == queue.RequestStream || name == queue.DeadLetterStream) && c.Discard != jetstream.DiscardNew {
			t.Errorf("stream %s discards %v when full: want the new message refused, never a queued one dropped", name, c.Discard)
		}
	}
	publish(t, q, "alice", "r1")
	subject := request.RequestPrefix + request.EncodeClientID("alice")
	for header, value := range map[string]string{
		jetstream.MsgRollup:      jetstream.MsgRollupSubject,
		jetstream.MsgTTLHeader:   "1s",
		jetstream.ScheduleHeader: "@every 1s",
	} {
		msg := nats.NewMsg(subject)
		msg.Header.Set(header, value)
		if header == jetstream.ScheduleHeader {
			msg.Header.Set(jetstream.ScheduleTargetHeader, subject)
		}
		msg.Data = []byte(`{}`)
		var apiErr *jetstream.APIError
		if _, err := js.PublishMsg(ctx, msg); !errors.As(err, &apiErr) {
			t.Errorf("a request published with %s: %s was taken (%v), want it refused", header, value, err)
		}
	}
	lane, count, _, err := q.ClientLane(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	head, ok, err := q.Head(ctx, lane)
	if err != nil || !ok || head.ID != "r1" || count != 1 {
		t.Fatalf("alice's queue after the attempts: %d requests, head %q %v %v, want r1 alone", count, head.ID, ok, err)
	}
}
