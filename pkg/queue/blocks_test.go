package queue_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// The events stream is stored in 4 MB blocks, not the 8 MB the server gives a stream
// without a per-subject limit: a status read that finds its block cold loads it whole
// (ADR 10, "Smaller blocks"). The server chooses the size from the stream's limits, so a
// server upgrade that chooses otherwise fails here: 6 MB of events fill two blocks, none
// over 4 MiB. Before the events stream had its per-subject limit they filled one.
func TestTheEventsStreamIsStoredInSmallBlocks(t *testing.T) {
	t.Parallel()
	s := queuetest.Server(t)
	nc := queuetest.Conn(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := queue.Open(ctx, nc, queue.Config{}, queue.CreateOrUpdate); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte("x"), 16<<10)
	const events = 384 // 6 MiB
	for i := range events {
		subject := request.ClientEventSubject("client-"+string(rune('a'+i%8)), request.EventDelivered)
		if _, err := js.PublishAsync(subject, body); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("events not stored in time")
	}
	if n := js.PublishAsyncPending(); n != 0 {
		t.Fatalf("%d events still pending", n)
	}
	dir := filepath.Join(s.StoreDir(), "$G", "streams", queue.EventStream, "msgs")
	var sizes []int64
	deadline := time.Now().Add(10 * time.Second)
	for { // blocks are flushed to their files in the background
		sizes = sizes[:0]
		var total int64
		files, _ := filepath.Glob(filepath.Join(dir, "*.blk"))
		for _, f := range files {
			if st, err := os.Stat(f); err == nil {
				sizes = append(sizes, st.Size())
				total += st.Size()
			}
		}
		if total >= events*int64(len(body)) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(sizes) < 2 {
		t.Fatalf("6 MiB of events are in %d block files (%v bytes) in %s; want 4 MB blocks", len(sizes), sizes, dir)
	}
	for _, size := range sizes {
		if size > 4<<20 {
			t.Fatalf("a block of the events stream holds %d bytes; want at most 4 MiB (%v)", size, sizes)
		}
	}
}
