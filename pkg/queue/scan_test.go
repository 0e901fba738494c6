package queue_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/penguinhq/dispatcher/pkg/fault"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
)

// A listing of the dead letters over a slow link reads every one of them. The server
// sends the messages as soon as the scan asks; while they are still on their way the
// scan's wait for the next one times out, and the consumer then reports nothing pending
// (the server sent it all): the scan must wait for what was sent, not end there. On a
// machine running two CI runs, a listing ended so with none of three dead letters, and an
// operator's listing or replay would have left them out without a word.
func TestDeadLettersOverASlowLinkAreAllRead(t *testing.T) {
	t.Parallel()
	s := queuetest.Server(t)
	q, err := queue.Open(context.Background(), queuetest.Conn(t, s), queue.Config{}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"ann", "ben", "cy"} {
		deadLetterOne(t, q, c, "dl-"+c)
	}
	p, err := fault.New(strings.TrimPrefix(s.ClientURL(), "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	nc, err := nats.Connect("nats://"+p.Addr(), nats.Timeout(queuetest.DialTimeout))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	slow, err := queue.Open(context.Background(), nc, queue.Config{}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	// Each way a second: the messages arrive two seconds after the scan asked, a second
	// after its wait for the next one ended.
	p.Delay(time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var got []string
	for r, err := range slow.DeadLetters(ctx, queue.DeadFilter{}) {
		if err != nil {
			t.Fatalf("reading dead letters over the slow link: %v", err)
		}
		got = append(got, r.ID)
	}
	if len(got) != 3 {
		t.Fatalf("read %d dead letters over the slow link (%v), want all 3", len(got), got)
	}
}
