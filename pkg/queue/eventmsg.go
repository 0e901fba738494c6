package queue

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/retry"
)

// One event as a message of the events stream: its subject, id and size bound.

// WriteEvent writes e and waits for the acknowledgement, retrying a few times within
// ctx: for processes that write an event now and then (a replay) and have no writer.
func (q *Queue) WriteEvent(ctx context.Context, e request.Event) error {
	if e.At.IsZero() {
		e.At = time.Now()
	}
	if err := request.ValidateID(e.ID); err != nil || e.ClientID == "" {
		return fmt.Errorf("event of request %q: not a request this service stored", e.ID)
	}
	_, err := retry.Do(ctx, retry.Policy{First: 100 * time.Millisecond, Max: time.Second, Tries: 5}, func(ctx context.Context) error {
		_, err := q.js.PublishMsg(ctx, eventMsg(e), jetstream.WithMsgID(eventMsgID(e)), jetstream.WithExpectStream(EventStream))
		return err
	})
	if err != nil {
		return fmt.Errorf("writing the %s event of request %s: %w", e.Type, e.ID, err)
	}
	return nil
}

// Announce publishes e to whoever subscribes to its subject now, without waiting and
// without storing it: ingest's accepted event (ADR 18), which the events stream does not
// take. A publish that fails (the connection down) is lost, as a notification nobody
// heard would be; the queued request stays the record of the acceptance.
func (q *Queue) Announce(e request.Event) {
	if !e.Recordable() {
		return
	}
	_ = q.nc.PublishMsg(eventMsg(e))
}

// chunkEnd is where the chunk of batch starting at lo ends: at most atomicMax events and,
// past the first, atomicBatchBytes of them.
func chunkEnd(batch []request.Event, lo int) int {
	hi, bytes := lo, 0
	for hi < len(batch) && hi-lo < atomicMax {
		size := 256 // an event without an answer: about its JSON
		if r := batch[hi].Response; r != nil {
			size += 2 * (len(r.Body) + 64*len(r.Headers))
		}
		if hi > lo && bytes+size > atomicBatchBytes {
			break
		}
		bytes += size
		hi++
	}
	return hi
}

// eventLimit is the most bytes of an event's JSON this queue's server takes in one
// message, with room for its headers.
func (q *Queue) eventLimit() int {
	return max(int(q.nc.MaxPayload())-eventHeadroom, 16<<10)
}

func eventMsg(e request.Event) *nats.Msg {
	m := nats.NewMsg(e.Subject())
	m.Header.Set(request.EventIDHeader, e.ID)
	m.Data = e.JSON()
	return m
}

// eventMsgID makes a write retried after its acknowledgement was lost land once. An
// attempt's event holds its time too: two alike in all else (an attempt numbered 1 again
// by a restarted dispatcher of the same name) are two attempts, both written. Other
// events do not.
func eventMsgID(e request.Event) string {
	id := e.ID + ":" + string(e.Type) + ":" + strconv.Itoa(e.Cycle) + ":" + strconv.Itoa(e.Attempt) + ":" + strconv.FormatUint(e.Seq, 10) + ":" + e.Instance
	if e.Type == request.EventAttemptStarted || e.Type == request.EventAttemptFailed {
		id += ":" + strconv.FormatInt(e.At.UnixNano(), 36)
	}
	return id
}
