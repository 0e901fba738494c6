package queue

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// EventStream holds every request's events (request.Event) on request.EventPrefix
// subjects, for StatusRetention: the durable status record and what penguin follows.
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
		Description: "Every request's outcomes (accepted, attempts, delivered, dead-lettered, replayed, purged): its status record.",
		Subjects:    []string{request.EventPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		// The oldest events go first when a limit is reached: the status of an old
		// request becomes unknown, nothing is refused.
		Discard:    jetstream.DiscardOld,
		MaxAge:     cfg.StatusRetention,
		MaxMsgs:    -1,
		MaxBytes:   maxBytes,
		Duplicates: cfg.DuplicateWindow,
		// Status reads are direct gets of the last event of each type; on a cluster a
		// follower may answer, at most its replication lag behind.
		AllowDirect: true,
		// The event writer stores what is waiting as one atomic batch: with fsync on
		// every write, one disk sync for the batch instead of one per event.
		AllowAtomicPublish: true,
	}
}

// EventWriter writes events to the events stream without ever holding up its caller for
// long: Record queues an event and returns; a loop (Run) publishes them in the order
// recorded, many at once, and retries a failed write until it lands. WriteNow queues
// one and waits (up to its context) until it and everything recorded before it are
// written. Only more than its buffer of events waiting at once (the stream unwritable
// for long) makes it drop one, counted and logged.
type EventWriter struct {
	js       jetstream.JetStream
	log      zerolog.Logger
	instance string
	in       chan queuedEvent
	metrics  eventMetrics

	failing atomic.Bool // the last write failed: WriteNow does not wait then

	eventLimit int // the most bytes of an event's JSON: the server's max_payload less headroom

	costs writeCosts // how to write what waits: Run's alone (writeAtomic)

	mu      sync.Mutex
	pending int           // recorded and not yet written
	idle    chan struct{} // closed when pending drops to zero
	dropped bool          // a drop was logged since the last success
}

// queuedEvent is an event waiting to be written; done, if not nil, is closed once it is.
type queuedEvent struct {
	request.Event
	done chan struct{}
}

// Defaults for the event writer.
const (
	DefaultEventBuffer = 100_000
	// answersBuffered is how many events may wait with raven's answer's body (up to
	// 256 KiB each): past it, events wait without it (EventWriter.enqueue).
	answersBuffered = 1_000
	// eventHeadroom is left of the server's max_payload for an event's headers.
	eventHeadroom = 4 << 10
	// atomicBatchBytes bounds an atomic batch's bytes as well as its messages: the
	// server stages a batch whole before it commits it.
	atomicBatchBytes = 8 << 20
	eventBatch       = 2048
	eventAckWait     = 5 * time.Second
	eventRetryMax    = time.Second
)

// NewEventWriter returns a writer for this queue's events stream; instance names the
// writing process in each event. buffer bounds the events waiting (DefaultEventBuffer
// if zero). Start its loop with Run.
func (q *Queue) NewEventWriter(instance string, buffer int, reg prometheus.Registerer, log zerolog.Logger) *EventWriter {
	if buffer <= 0 {
		buffer = DefaultEventBuffer
	}
	return &EventWriter{js: q.js, log: log.With().Str("component", "events").Logger(), instance: instance,
		in: make(chan queuedEvent, buffer), metrics: newEventMetrics(reg), eventLimit: q.eventLimit()}
}

// Record queues e to be written. It never blocks: with the buffer full it drops e,
// counts it and logs once until a write succeeds again.
func (w *EventWriter) Record(e request.Event) { w.enqueue(e, nil) }

// WriteNow queues e and waits until it is written, or ctx ends (it stays queued then).
// Dispatchers write final events this way before removing the request from the queue,
// so that a crash right after the removal cannot lose them; going through the queue
// keeps them after the request's earlier events. While writes fail it does not wait:
// the events stream being down must not hold up every lane. It says whether e was
// written; one that was not stays queued (unless the buffer was full), and the caller
// keeps it with Queue.KeepOutcome before the removal.
func (w *EventWriter) WriteNow(ctx context.Context, e request.Event) (written bool) {
	done := make(chan struct{})
	if !w.enqueue(e, done) || w.failing.Load() {
		return false
	}
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

func (w *EventWriter) enqueue(e request.Event, done chan struct{}) bool {
	if w == nil || !writable(e) {
		return false
	}
	if e.Instance == "" {
		e.Instance = w.instance
	}
	if e.At.IsZero() {
		e.At = time.Now()
	}
	e = e.Fit(w.eventLimit)
	w.mu.Lock()
	if e.Response != nil && e.Response.BodyBytes > 0 && w.pending >= answersBuffered {
		// The stream has not taken events for a while: what waits is bounded by
		// bytes too, so the bodies of raven's answers give way (their status and
		// headers stay). A final event kept in the queue meanwhile keeps this cut too.
		e.Response = e.Response.Cut(0)
	}
	select {
	case w.in <- queuedEvent{Event: e, done: done}:
		w.pending++
		w.mu.Unlock()
		return true
	default:
		logIt := !w.dropped
		w.dropped = true
		w.mu.Unlock()
		w.metrics.dropped.Inc()
		if logIt {
			w.log.Error().Str("request_id", e.ID).Str("type", string(e.Type)).
				Msg("events are not being written (the events stream does not take them) and the buffer is full: dropping events, so some statuses will lag; see dispatch_events_dropped_total")
		}
		return false
	}
}

// writable says whether e names a request this service stored: one published straight
// to a request subject may have any id, which must not become an event subject.
func writable(e request.Event) bool { return e.ClientID != "" && request.ValidateID(e.ID) == nil }

// Flush waits until every event recorded so far is written, or ctx ends.
func (w *EventWriter) Flush(ctx context.Context) error {
	for {
		w.mu.Lock()
		if w.pending == 0 {
			w.mu.Unlock()
			return nil
		}
		if w.idle == nil {
			w.idle = make(chan struct{})
		}
		idle := w.idle
		w.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (w *EventWriter) done(n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending -= n
	if n > 0 {
		w.dropped = false
	}
	if w.pending == 0 && w.idle != nil {
		close(w.idle)
		w.idle = nil
	}
}

// Run writes events until ctx ends, then for up to grace more to write what is waiting.
func (w *EventWriter) Run(ctx context.Context, grace time.Duration) {
	var retry []queuedEvent // failed writes: they go first, in order
	wait := 50 * time.Millisecond
	var stopAt time.Time // set once ctx ended: the flush's deadline
	for {
		batch := retry
		retry = nil
		if len(batch) == 0 && stopAt.IsZero() {
			select {
			case e := <-w.in:
				batch = append(batch, e)
			case <-ctx.Done():
				stopAt = time.Now().Add(grace)
			}
		}
	fill:
		for len(batch) < eventBatch {
			select {
			case e := <-w.in:
				batch = append(batch, e)
			default:
				break fill
			}
		}
		if len(batch) > 0 {
			retry = w.write(batch)
			w.done(len(batch) - len(retry))
		}
		if !stopAt.IsZero() && (len(retry) == 0 && len(w.in) == 0 || time.Now().After(stopAt)) {
			if n := len(retry) + len(w.in); n > 0 {
				w.log.Warn().Int("events", n).Msg("stopping with events not written: those requests' statuses lag until their next event")
			}
			return
		}
		if len(retry) == 0 {
			wait = 50 * time.Millisecond
			continue
		}
		w.metrics.retried.Add(float64(len(retry)))
		pause, stop := wait, ctx.Done()
		if !stopAt.IsZero() { // flushing: ctx has ended, only the deadline counts
			pause, stop = min(wait, max(time.Until(stopAt), 0)), nil
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-stop:
			stopAt = time.Now().Add(grace)
		}
		t.Stop()
		wait = min(2*wait, eventRetryMax)
	}
}

// write publishes batch at once and waits for the acknowledgements; it returns the
// events to write again, in order. A failed event that is not final is given up when a
// later event of the same request follows it in the batch: written now, it would land
// after that one.
func (w *EventWriter) write(batch []queuedEvent) []queuedEvent {
	errs := make([]error, len(batch))
	for lo, hi := 0, 0; lo < len(batch); lo = hi {
		hi = chunkEnd(batch, lo)
		chunk, start := batch[lo:hi], time.Now()
		atomically := w.costs.atomicNext(len(chunk), start)
		switch {
		case atomically && w.writeAtomic(chunk):
			w.costs.note(true, len(chunk), time.Since(start))
		case atomically:
			w.writeEach(chunk, errs[lo:hi]) // not measured: it followed a failure
		default:
			w.writeEach(chunk, errs[lo:hi])
			if firstErr(errs[lo:hi]) == nil {
				w.costs.note(false, len(chunk), time.Since(start))
			}
		}
	}
	var retry []queuedEvent
	later := map[string]bool{} // requests with a later event in the batch
	for i := len(batch) - 1; i >= 0; i-- {
		e := batch[i]
		switch {
		case errs[i] == nil:
			w.metrics.written.Inc()
			e.finish()
		case e.Final() || !later[e.ID]:
			retry = append(retry, e)
		default:
			e.finish() // given up: nobody waits for it
		}
		later[e.ID] = true
	}
	err := firstErr(errs)
	switch was := w.failing.Swap(err != nil); {
	case err != nil && !was:
		w.log.Warn().Err(err).Int("events", len(retry)).Msg("writing request events failed; retrying until they land (statuses lag meanwhile)")
	case err == nil && was:
		w.log.Info().Msg("request events are written again")
	}
	slices.Reverse(retry)
	return retry
}

// writeAtomic stores batch as one atomic batch (publishAtomic) and says whether it did.
// All are stored or none: when it fails (or no acknowledgement comes, when it may have
// been stored), writeEach writes the same events one by one, and their message ids make
// any already stored count as written.
func (w *EventWriter) writeAtomic(batch []queuedEvent) bool {
	ctx, cancel := context.WithTimeout(context.Background(), eventAckWait)
	defer cancel()
	msgs := make([]*nats.Msg, len(batch))
	for i, e := range batch {
		msgs[i] = eventMsg(e.Event)
		msgs[i].Header.Set(jetstream.MsgIDHeader, eventMsgID(e.Event))
	}
	_, err := publishAtomic(ctx, w.js, EventStream, msgs)
	if refusesAtomic(err) {
		w.costs.refused(time.Now())
		w.log.Info().Dur("retry_in", atomicRetry).Msg("the events stream does not take atomic batches (created by an earlier version; a dispatcher's start updates it): writing events one by one meanwhile")
	}
	if err != nil {
		return false
	}
	w.metrics.batches.Inc()
	return true
}

// writeEach publishes batch's events at once, each on its own, and waits for their
// acknowledgements, setting errs[i] for each that failed.
func (w *EventWriter) writeEach(batch []queuedEvent, errs []error) {
	futures := make([]jetstream.PubAckFuture, len(batch))
	for i, e := range batch {
		futures[i], errs[i] = w.js.PublishMsgAsync(eventMsg(e.Event), jetstream.WithMsgID(eventMsgID(e.Event)), jetstream.WithExpectStream(EventStream))
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

func (e queuedEvent) finish() {
	if e.done != nil {
		close(e.done)
	}
}

func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

type eventMetrics struct {
	written, retried, dropped, batches prometheus.Counter
}

func newEventMetrics(reg prometheus.Registerer) eventMetrics {
	m := eventMetrics{
		written: prometheus.NewCounter(prometheus.CounterOpts{Name: "dispatch_events_written_total", Help: "Request events written to the events stream."}),
		retried: prometheus.NewCounter(prometheus.CounterOpts{Name: "dispatch_events_retried_total", Help: "Event writes that failed and were retried."}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "dispatch_events_dropped_total", Help: "Events dropped because the writer's buffer was full (the events stream not taking writes for long): those requests' statuses lag."}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{Name: "dispatch_event_batches_total", Help: "Atomic batches of events written: events waiting at once are stored together, with one disk sync when fsync is on for every write."}),
	}
	if reg != nil {
		reg.MustRegister(m.written, m.retried, m.dropped, m.batches)
	}
	return m
}
