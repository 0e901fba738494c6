package record

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Sink stores events in the record (the queue's events stream).
type Sink interface {
	// Store stores events in order, many at once where it can, and sets errs[i] for each
	// it did not store (errs is as long as events). It says how many atomic batches it
	// stored (all of their events or none).
	Store(events []request.Event, errs []error) (batches int)
	// EventLimit is the most bytes of an event's JSON the store takes in one write.
	EventLimit() int
}

// Writer writes events to the record without ever holding up its caller for
// long: Record queues an event and returns; a loop (Run) publishes them in the order
// recorded, many at once, and retries a failed write until it lands. WriteNow queues
// one and waits (up to its context) until it and everything recorded before it are
// written. Only more than its buffer of events waiting at once (the stream unwritable
// for long) makes it drop one, counted and logged.
type Writer struct {
	sink     Sink
	log      zerolog.Logger
	instance string
	in       chan queuedEvent
	metrics  eventMetrics

	failing atomic.Bool // the last write failed: WriteNow does not wait then

	eventLimit int // the most bytes of an event's JSON: the server's max_payload less headroom

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

// Defaults for the writer.
const (
	DefaultBuffer = 100_000
	// answersBuffered is how many events may wait with raven's answer's body (up to
	// 256 KiB each): past it, events wait without it (Writer.enqueue).
	answersBuffered = 1_000
	eventBatch      = 2048
	eventRetryMax   = time.Second
)

// New returns a writer to sink; instance names the writing process in each event.
// buffer bounds the events waiting (DefaultBuffer if zero). Start its loop with Run.
func New(sink Sink, instance string, buffer int, reg prometheus.Registerer, log zerolog.Logger) *Writer {
	if buffer <= 0 {
		buffer = DefaultBuffer
	}
	return &Writer{sink: sink, log: log, instance: instance,
		in: make(chan queuedEvent, buffer), metrics: newEventMetrics(reg), eventLimit: sink.EventLimit()}
}

// Record queues e to be written. It never blocks: with the buffer full it drops e,
// counts it and logs once until a write succeeds again.
func (w *Writer) Record(e request.Event) { w.enqueue(e, nil) }

// WriteNow queues e and waits until it is written, or ctx ends (it stays queued then).
// Dispatchers write final events this way before removing the request from the queue,
// so that a crash right after the removal cannot lose them; going through the queue
// keeps them after the request's earlier events. While writes fail it does not wait:
// the events stream being down must not hold up every lane. It says whether e was
// written; one that was not stays queued (unless the buffer was full), and the caller
// keeps it in the queue (the dispatcher's Source.KeepOutcome) before the removal.
func (w *Writer) WriteNow(ctx context.Context, e request.Event) (written bool) {
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

func (w *Writer) enqueue(e request.Event, done chan struct{}) bool {
	if w == nil || !e.Recordable() {
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

// Flush waits until every event recorded so far is written, or ctx ends.
func (w *Writer) Flush(ctx context.Context) error {
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

func (w *Writer) done(n int) {
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
func (w *Writer) Run(ctx context.Context, grace time.Duration) {
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

// write stores batch at once (Sink.Store); it returns the
// events to write again, in order. A failed event that is not final is given up when a
// later event of the same request follows it in the batch: written now, it would land
// after that one.
func (w *Writer) write(batch []queuedEvent) []queuedEvent {
	events := make([]request.Event, len(batch))
	for i, e := range batch {
		events[i] = e.Event
	}
	errs := make([]error, len(batch))
	if n := w.sink.Store(events, errs); n > 0 {
		w.metrics.batches.Add(float64(n))
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
