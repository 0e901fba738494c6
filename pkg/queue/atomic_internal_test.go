package queue

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A writer takes the way that has cost less per message lately, tries the other once a
// second, never takes a small batch or a refused stream atomically, and a pause of the
// process does not turn it.
func TestWriteCostsChooseTheCheaperWay(t *testing.T) {
	var c writeCosts
	now := time.Unix(1000, 0)
	if c.atomicNext(atomicMin-1, now) {
		t.Fatal("a batch smaller than atomicMin went atomically")
	}
	if !c.atomicNext(100, now) {
		t.Fatal("the first batch did not measure the atomic way")
	}
	c.note(true, 100, 5*time.Millisecond) // 50 us an event
	if c.atomicNext(100, now) {
		t.Fatal("the second batch did not measure the other way")
	}
	c.note(false, 100, 20*time.Millisecond) // 200 us an event: a synced disk
	if !c.atomicNext(100, now) {
		t.Fatal("the cheaper atomic way was not chosen")
	}
	// Once a second the dearer way is tried again, and believed at once if cheaper now.
	later := now.Add(costsRetry)
	if c.atomicNext(100, later) {
		t.Fatal("the dearer way was not tried after a second")
	}
	c.note(false, 100, 2*time.Millisecond) // the disk no longer syncs each write
	if c.atomicNext(100, later) {
		t.Fatal("a way found cheaper was not taken at once")
	}
	// A pause of the process (100 ms for one batch) moves the estimate by at most a
	// quarter, so the way stays.
	c.note(false, 100, 100*time.Millisecond)
	if c.each > 25e-6 || c.atomicNext(100, later) {
		t.Fatalf("one slow batch turned the writer (each: %v s an event)", c.each)
	}
	// A lasting change does turn it.
	for range 10 {
		c.note(false, 100, 20*time.Millisecond)
	}
	if !c.atomicNext(100, later) {
		t.Fatalf("a lasting change did not turn the writer (each: %v s an event)", c.each)
	}
}

// A commit answered without the batch's id and count (a server older than 2.12 stores
// each message alone and acknowledges the last as one) is an error, so that the caller
// publishes the messages again one by one instead of counting unacknowledged ones as
// stored. Here a plain subscriber answers as such a server would.
func TestAtomicCommitAnsweredAsOneMessageIsAnError(t *testing.T) {
	t.Parallel()
	srv, err := server.NewServer(&server.Options{JetStream: true, StoreDir: t.TempDir(), DontListen: true, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(time.Minute) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect("", nats.InProcessServer(srv))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var got []*nats.Msg
	sub, err := nc.Subscribe("old.server", func(m *nats.Msg) {
		got = append(got, m)
		if m.Reply != "" {
			_ = m.Respond([]byte(`{"stream":"OLD","seq":3}`))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	js, _ := jetstream.New(nc)
	msgs := []*nats.Msg{nats.NewMsg("old.server"), nats.NewMsg("old.server"), nats.NewMsg("old.server")}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := publishAtomic(ctx, js, "OLD", msgs); err == nil || !strings.Contains(err.Error(), "older than 2.12") {
		t.Fatalf("publishAtomic: %v, want the acknowledgement refused as an old server's", err)
	}
	if len(got) != 3 || got[2].Header.Get(batchCommitHeader) != "1" || got[0].Header.Get(batchSeqHeader) != "1" {
		t.Fatalf("the server saw %d messages (commit %q, first sequence %q), want 3 with the batch's headers",
			len(got), got[len(got)-1].Header.Get(batchCommitHeader), got[0].Header.Get(batchSeqHeader))
	}
}
