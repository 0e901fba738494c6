package queue

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/record"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// EventStream holds every request's events (request.Event) on request.EventPrefix
// subjects, for StatusRetention: the durable status record and what penguin follows.
// It stores every type but request.EventAccepted, which is live only (ADR 18): the
// queued request is the record of its acceptance.
const EventStream = "EVENTS"

// DefaultStatusRetention is how long events, and so a request's status, are kept.
const DefaultStatusRetention = 24 * time.Hour

func eventStreamConfig(cfg Config) jetstream.StreamConfig {
	maxBytes := cfg.EventsMaxBytes
	if maxBytes <= 0 {
		maxBytes = -1
	}
	return jetstream.StreamConfig{
		Name:        EventStream,
		Description: "Every request's outcomes (attempts, delivered, dead-lettered, replayed, purged, cancelled): its status record.",
		Subjects:    storedEventSubjects(),
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		// The oldest events go first when a limit is reached: the status of an old
		// request becomes unknown, nothing is refused.
		Discard:  jetstream.DiscardOld,
		MaxAge:   cfg.StatusRetention,
		MaxMsgs:  -1,
		MaxBytes: maxBytes,
		// No subject reaches this limit; it is set for the block size it gives. A file
		// stream with a per-subject limit (and no MaxBytes or MaxMsgs) is stored in 4 MB
		// blocks, one without in 8 MB, and a status read that finds its block cold loads
		// the block whole: half the bytes for the p99 read (ADR 10, "Smaller blocks").
		MaxMsgsPerSubject: eventsPerSubjectLimit,
		Duplicates:        cfg.DuplicateWindow,
		// Status reads are direct gets of the last event of each type; on a cluster a
		// follower may answer, at most its replication lag behind.
		AllowDirect: true,
		// The event writer stores what is waiting as one atomic batch: with fsync on
		// every write, one disk sync for the batch instead of one per event.
		AllowAtomicPublish: true,
	}
}

// storedEventSubjects is the events stream's subjects: one per stored type
// (request.StoredEventTypes) over every client. An accepted event published on its
// client's subject reaches whoever subscribes and is not stored (ADR 18); a stream
// created with "dispatch.events.>" is narrowed to these by a dispatcher's start.
func storedEventSubjects() []string {
	subjects := make([]string, len(request.StoredEventTypes))
	for i, typ := range request.StoredEventTypes {
		subjects[i] = request.EventPrefix + "*." + string(typ)
	}
	return subjects
}

// eventsPerSubjectLimit is the events stream's per-subject limit: more events than a
// client makes of one type in any retention, so that it never removes one.
const eventsPerSubjectLimit = 1 << 53

// NewEventWriter returns a writer of this queue's events stream; instance names the
// writing process in each event. buffer bounds the events waiting (record.DefaultBuffer
// if zero). Start its loop with Run.
func (q *Queue) NewEventWriter(instance string, buffer int, reg prometheus.Registerer, log zerolog.Logger) *record.Writer {
	log = log.With().Str("component", "events").Logger()
	return record.New(&eventSink{js: q.js, limit: q.eventLimit()}, instance, buffer, reg, log)
}

// Bounds of the events stream's writes.
const (
	// eventHeadroom is left of the server's max_payload for an event's headers.
	eventHeadroom = 4 << 10
	// atomicBatchBytes bounds an atomic batch's bytes as well as its messages: the
	// server stages a batch whole before it commits it.
	atomicBatchBytes = 8 << 20
	eventAckWait     = 5 * time.Second
)

// eventSink is how one record.Writer stores its events in the events stream: as atomic
// batches when they cost less than one by one (costs), one by one otherwise or after a
// batch failed. Only that writer's loop uses it.
type eventSink struct {
	js    jetstream.JetStream
	limit int
	costs writeCosts
}

func (s *eventSink) EventLimit() int { return s.limit }

// Store implements record.Sink: events in chunks (chunkEnd), each an atomic batch or
// one by one.
func (s *eventSink) Store(events []request.Event, errs []error) (batches int) {
	for lo, hi := 0, 0; lo < len(events); lo = hi {
		hi = chunkEnd(events, lo)
		chunk, start := events[lo:hi], time.Now()
		atomically := s.costs.atomicNext(len(chunk), start)
		switch {
		case atomically && s.writeAtomic(chunk):
			s.costs.note(true, len(chunk), time.Since(start))
			batches++
		case atomically:
			s.writeEach(chunk, errs[lo:hi]) // not measured: it followed a failure
		default:
			s.writeEach(chunk, errs[lo:hi])
			if errors.Join(errs[lo:hi]...) == nil {
				s.costs.note(false, len(chunk), time.Since(start))
			}
		}
	}
	return batches
}

// writeAtomic stores batch as one atomic batch (publishAtomic) and says whether it did.
// All are stored or none: when it fails (or no acknowledgement comes, when it may have
// been stored), writeEach writes the same events one by one, and their message ids make
// any already stored count as written.
func (s *eventSink) writeAtomic(batch []request.Event) bool {
	ctx, cancel := context.WithTimeout(context.Background(), eventAckWait)
	defer cancel()
	msgs := make([]*nats.Msg, len(batch))
	for i, e := range batch {
		msgs[i] = eventMsg(e)
		msgs[i].Header.Set(jetstream.MsgIDHeader, eventMsgID(e))
	}
	_, err := publishAtomic(ctx, s.js, EventStream, msgs)
	return err == nil
}

// writeEach publishes batch's events at once, each on its own, and waits for their
// acknowledgements, setting errs[i] for each that failed.
func (s *eventSink) writeEach(batch []request.Event, errs []error) {
	futures := make([]jetstream.PubAckFuture, len(batch))
	for i, e := range batch {
		futures[i], errs[i] = s.js.PublishMsgAsync(eventMsg(e), jetstream.WithMsgID(eventMsgID(e)), jetstream.WithExpectStream(EventStream))
	}
	deadline := time.NewTimer(eventAckWait)
	defer deadline.Stop()
	for i, f := range futures {
		if errs[i] != nil {
			continue
		}
		select {
		case <-f.Ok():
		case err := <-f.Err():
			errs[i] = err
		case <-deadline.C:
			errs[i] = errors.New("no acknowledgement within " + eventAckWait.String())
			deadline.Reset(0) // the rest have had as long
		}
	}
}
