package queue

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Atomic batches (JetStream's, nats-server 2.12 and later; ADR 11). The event writer and
// PublishAll store what waits together this way when it has been cheaper lately.

// publishAtomic stores msgs in stream as one atomic batch: all or none, in order, the
// sequences consecutive up to the returned one, the last's. With fsync on every write
// (sync_interval: always) a single server syncs the disk once for the batch, where
// publishes one by one sync once each. msgs carry their own headers (a message id); the
// batch's are added here. At most atomicMax.
//
// A server older than 2.12 ignores the batch's headers and stores each message alone,
// acknowledging the last only: its acknowledgement then lacks the batch's id and count,
// and that is an error here, so that the caller publishes them again one by one (their
// message ids make the copies land once).
func publishAtomic(ctx context.Context, js jetstream.JetStream, stream string, msgs []*nats.Msg) (seq uint64, err error) {
	id := rand.Text() // unique among the stream's open batches, whoever writes them
	nc := js.Conn()
	for i, m := range msgs {
		m.Header.Set(jetstream.ExpectedStreamHeader, stream)
		m.Header.Set(batchIDHeader, id)
		m.Header.Set(batchSeqHeader, strconv.Itoa(i+1))
		if i < len(msgs)-1 {
			// No reply: a gap or a refusal is reported on the commit.
			if err := nc.PublishMsg(m); err != nil {
				return 0, err
			}
			continue
		}
		m.Header.Set(batchCommitHeader, "1")
	}
	reply, err := nc.RequestMsgWithContext(ctx, msgs[len(msgs)-1])
	if err != nil {
		return 0, err
	}
	var ack struct {
		Stream string              `json:"stream"`
		Seq    uint64              `json:"seq"`
		Batch  string              `json:"batch"`
		Count  int                 `json:"count"`
		Error  *jetstream.APIError `json:"error"`
	}
	switch err := json.Unmarshal(reply.Data, &ack); {
	case err != nil:
		return 0, fmt.Errorf("atomic batch: acknowledgement %q: %w", reply.Data, err)
	case ack.Error != nil:
		return 0, ack.Error
	case ack.Stream != stream || ack.Batch != id || ack.Count != len(msgs):
		return 0, fmt.Errorf("atomic batch: acknowledged as %s %q of %d messages, want %s %q of %d (a server older than 2.12 stores them one by one)",
			ack.Stream, ack.Batch, ack.Count, stream, id, len(msgs))
	}
	return ack.Seq, nil
}

// JetStream's atomic batch headers (ADR-50; nats.go has no publisher for them yet).
const (
	batchIDHeader     = "Nats-Batch-Id"
	batchSeqHeader    = "Nats-Batch-Sequence"
	batchCommitHeader = "Nats-Batch-Commit"
)

// atomicMax is the most messages stored as one atomic batch: the server's limit (1,000
// by default).
const atomicMax = 1000

// writeCosts chooses how a batch of messages waiting together is stored: as one atomic
// batch or one by one, by what each way has cost per message lately.
//
// Measured (nats-server 2.15, one server, 2 cores; BENCHMARKS.md, ADR 11): with fsync on
// every write, 200 callers waiting on their events got 21,000 events/s from atomic
// batches of ~110 against 4,400/s one by one; 20 callers (batches of ~13) got
// 3,300-4,000/s against 5,400/s. Without it, one by one always won (56,000/s against
// 23,000/s): a single server stages each atomic batch in a store of its own, a few
// milliseconds a batch. The server's sync setting cannot be asked, and the load moves,
// so the writer measures.
type writeCosts struct {
	atomic, each float64   // recent seconds per message of each way; 0: not measured yet
	tried        time.Time // when the dearer way was last tried
}

const (
	// atomicMin is the smallest batch stored atomically: below it the batch's own cost
	// is never won back.
	atomicMin = 8
	// costsRetry is how often the dearer way is tried again, to follow a change of load:
	// at most a batch a second, a few milliseconds of it at worst.
	costsRetry = time.Second
)

// atomicNext says whether a batch of n messages, stored at now, goes as an atomic batch.
func (c *writeCosts) atomicNext(n int, now time.Time) bool {
	if n < atomicMin {
		return false
	}
	switch {
	case c.atomic == 0:
		c.tried = now
		return true
	case c.each == 0:
		c.tried = now
		return false
	}
	cheaper := c.atomic < c.each
	if now.Sub(c.tried) >= costsRetry {
		c.tried = now
		return !cheaper
	}
	return cheaper
}

// note records what storing n messages one way took. An estimate moves a quarter of the
// way to each new figure, which counts for at most twice the estimate (a pause of the
// process is not the way's cost), except that a way found cheaper than it was thought is
// believed at once: the dearer way is only tried once a second.
func (c *writeCosts) note(atomically bool, n int, took time.Duration) {
	if n < atomicMin {
		return
	}
	per := took.Seconds() / float64(n)
	cost := &c.each
	if atomically {
		cost = &c.atomic
	}
	switch {
	case *cost == 0 || per < *cost:
		*cost = per
	default:
		*cost += (min(per, 2**cost) - *cost) / 4
	}
}
