package queue

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/retry"
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
	}
}

// EventReadTimeout bounds a read of a request's events when its context has no deadline
// of its own.
const EventReadTimeout = 5 * time.Second

// Reading a request's events (ADR 10): its client's events from the request's time on.
const (
	// eventReadBatch is how many events one direct get returns at most; the first of a
	// read, eventFirstBatch.
	eventReadBatch  = 256
	eventFirstBatch = 16
	// eventClockMargin is how much earlier than where a request's events start they
	// are read from: the id's time is ingest's clock and the events' the store's, and
	// events written by different processes land a little out of order. Every second of
	// it is a second of every client's events for the server to pass.
	eventClockMargin = 2 * time.Second
	// eventClockMarginWide is the margin of a second read when the first found nothing:
	// clocks further apart than eventClockMargin cost that read, not a wrong answer.
	eventClockMarginWide = 10 * time.Minute
)

// Events reads the events of request id of client clientID (ADR 10): its client's events
// from the request's time on, until its final event, with those of a replay. A request
// id made by NewID holds its time; a keyed one does not, and its client's acceptances
// are read from the start of the record to find it. What a request from before ADR 10
// recorded is read the way it was written, as it is when clientID is "" (then nothing
// newer is found). No events: an empty list.
func (q *Queue) Events(ctx context.Context, clientID, id string) ([]request.Event, error) {
	if err := request.ValidateID(id); err != nil {
		return nil, err
	}
	if clientID != "" {
		if err := request.ValidateClientID(clientID); err != nil {
			return nil, err
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		// A direct get is a plain request: an answer that never comes (a responder that
		// went away mid-read) would hold the caller for as long as its context lasts.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, EventReadTimeout)
		defer cancel()
	}
	var out []request.Event
	if clientID != "" {
		r := eventRead{q: q, id: id, client: clientID, seen: map[uint64]bool{}}
		if err := r.read(ctx); err != nil {
			return nil, fmt.Errorf("reading events of %s: %w", id, err)
		}
		for _, e := range r.events {
			out = append(out, e.Event)
		}
	}
	if len(out) > 0 {
		return out, nil
	}
	return q.legacyEvents(ctx, id)
}

// ClientOfEvents finds the client of request id from the events stream alone, for an
// operator who has only the id: it reads every client's acceptances stored from a
// couple of seconds before the id's time, at most clientSearchEvents of them, for the
// id's. Best effort: false for a keyed id (it holds no time), for one accepted when
// more than that many others were, or whose acceptance is not stored.
func (q *Queue) ClientOfEvents(ctx context.Context, id string) (string, bool, error) {
	at, ok := request.IDTime(id)
	if !ok {
		return "", false, nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, EventReadTimeout)
		defer cancel()
	}
	found, err := q.scanEvents(ctx, scan{filter: request.EventPrefix + "*." + request.EventAccepted, id: id,
		from: at.Add(-eventClockMargin), limit: clientSearchEvents, stop: func(storedEvent) bool { return true }})
	if err != nil || len(found) == 0 {
		return "", false, err
	}
	return found[0].ClientID, true, nil
}

// clientSearchEvents bounds ClientOfEvents' read: about 2 MB of events.
const clientSearchEvents = 8192

// eventRead gathers one request's events from its client's subjects, each read as one
// literal subject: a read over a wildcard ("dispatch.events.<token>.*") makes the server
// pass every block from where it starts to the stream's end (measured: 38 ms at p50
// where one literal subject took 0.2 ms, 2 M requests over 20,000 clients).
type eventRead struct {
	q      *Queue
	id     string
	client string
	seen   map[uint64]bool // stream sequences already taken
	events []storedEvent
}

// storedEvent is an event with where and when the stream stored it.
type storedEvent struct {
	request.Event
	seq uint64
	at  time.Time
}

func (r *eventRead) read(ctx context.Context) error {
	if err := r.readFrom(ctx, eventClockMargin); err != nil || len(r.events) > 0 {
		return err
	}
	return r.readFrom(ctx, eventClockMarginWide)
}

// readFrom reads the request's events from margin before where they start: in one round
// trip its acceptance, its replays and its final event, each from its subject; in a
// second its attempts, up to its final event.
func (r *eventRead) readFrom(ctx context.Context, margin time.Duration) error {
	subject := func(typ string) string { return request.ClientEventSubject(r.client, typ) }
	from, timed := request.IDTime(r.id)
	var floor uint64 // the latest copy's sequence: a final of an earlier copy does not count
	if timed {
		from = from.Add(-margin)
	} else {
		// A keyed id: its latest copy's acceptance says where its events start: when
		// ingest made the event, right after the store took the request, and before any
		// of the request's events was made (the event itself may land later, retried).
		acc, err := r.q.scanEvents(ctx, scan{filter: subject(request.EventAccepted), id: r.id})
		if err != nil {
			return err
		}
		r.take(acc)
		if len(acc) > 0 {
			last := acc[len(acc)-1]
			from, floor = made(last).Add(-margin), last.Seq
		}
	}
	final := func(cycle int, floor uint64) func(storedEvent) bool {
		return func(e storedEvent) bool { return e.Cycle >= cycle && (e.Seq == 0 || e.Seq >= floor) }
	}
	round := []scan{
		{filter: subject(request.EventReplayed)},
		{filter: subject(request.EventDelivered), stop: final(0, floor)},
		{filter: subject(request.EventDeadLettered), stop: final(0, floor)},
		{filter: subject(request.EventPurged), stop: final(0, floor)},
	}
	if timed {
		round = append(round, scan{filter: subject(request.EventAccepted), stop: func(storedEvent) bool { return true }})
	}
	found, err := r.scanAll(ctx, from, round)
	if err != nil {
		return err
	}
	// The latest replay: its cycle's events are the ones that count, from when it was
	// made (right after the request was queued again).
	cycle := 0
	var replay *storedEvent
	for i, e := range found[0] {
		if e.Cycle > cycle {
			cycle, replay = e.Cycle, &found[0][i]
		}
	}
	finals := slices.Concat(found[1], found[2], found[3])
	if replay != nil {
		floor = max(floor, replay.Seq)
		stop := final(cycle, floor)
		if !slices.ContainsFunc(finals, stop) {
			from = made(*replay).Add(-margin)
			again, err := r.scanAll(ctx, from, []scan{
				{filter: subject(request.EventDelivered), stop: stop},
				{filter: subject(request.EventDeadLettered), stop: stop},
				{filter: subject(request.EventPurged), stop: stop},
			})
			if err != nil {
				return err
			}
			finals = slices.Concat(finals, again[0], again[1], again[2])
		}
	}
	for _, f := range found {
		r.take(f)
	}
	r.take(finals)
	// Its attempts, up to its final event if it has one (a later attempt event of it
	// does not change its state), else to the end.
	var until uint64
	if i := slices.IndexFunc(finals, final(cycle, floor)); i >= 0 {
		until = finals[i].seq
	}
	attempts, err := r.scanAll(ctx, from, []scan{
		{filter: subject(request.EventAttemptStarted), until: until},
		{filter: subject(request.EventAttemptFailed), until: until},
	})
	if err != nil {
		return err
	}
	for _, a := range attempts {
		r.take(a)
	}
	return nil
}

// take keeps found events not taken yet, in the order stored.
func (r *eventRead) take(found []storedEvent) {
	for _, e := range found {
		if !r.seen[e.seq] {
			r.seen[e.seq] = true
			r.events = append(r.events, e)
		}
	}
	slices.SortFunc(r.events, func(a, b storedEvent) int { return cmp.Compare(a.seq, b.seq) })
}

// scanAll runs scans of the request's events at once, each from from: one round trip.
func (r *eventRead) scanAll(ctx context.Context, from time.Time, scans []scan) ([][]storedEvent, error) {
	out := make([][]storedEvent, len(scans))
	errs := make([]error, len(scans))
	var wg sync.WaitGroup
	for i, sc := range scans {
		sc.id, sc.from = r.id, from
		wg.Go(func() { out[i], errs[i] = r.q.scanEvents(ctx, sc) })
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// made is when event e was made (its At, set before its first write), else when it was
// stored.
func made(e storedEvent) time.Time {
	if !e.At.IsZero() {
		return e.At
	}
	return e.at
}

// scan is one read of the events stream: the events of request id on filter stored
// from time from on (from the first if zero), until stop says so of one of them, one
// stored after sequence until (if not zero) is reached, limit events were read (if not
// zero), or the end.
type scan struct {
	filter string
	id     string
	from   time.Time
	stop   func(storedEvent) bool
	until  uint64
	limit  int
}

func (q *Queue) scanEvents(ctx context.Context, sc scan) ([]storedEvent, error) {
	type get struct {
		Seq       uint64     `json:"seq,omitempty"`
		NextFor   string     `json:"next_by_subj"`
		StartTime *time.Time `json:"start_time,omitempty"`
		Batch     int        `json:"batch"`
	}
	// The first batch is small: most reads find what they look for among the first few
	// events, and a batch's buffer is allocated whole.
	req := get{NextFor: sc.filter, Batch: eventFirstBatch, Seq: 1}
	if !sc.from.IsZero() {
		req.StartTime, req.Seq = &sc.from, 0
	}
	var found []storedEvent
	read := 0
	for {
		msgs, err := DirectBatch(ctx, q.nc, EventStream, req, req.Batch)
		if err != nil {
			return nil, err
		}
		read += len(msgs)
		for _, m := range msgs {
			seq, _ := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
			if sc.until > 0 && seq > sc.until {
				return found, nil
			}
			if id := m.Header.Get(request.EventIDHeader); id != "" && id != sc.id {
				continue
			}
			var e request.Event
			if err := json.Unmarshal(m.Data, &e); err != nil || e.ID != sc.id {
				continue // another request's, or not written by this service
			}
			at, _ := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
			found = append(found, storedEvent{Event: e, seq: seq, at: at})
			if sc.stop != nil && sc.stop(found[len(found)-1]) {
				return found, nil
			}
		}
		if len(msgs) == 0 || sc.limit > 0 && read >= sc.limit {
			return found, nil
		}
		last := msgs[len(msgs)-1]
		if last.Header.Get("Nats-Num-Pending") == "0" {
			return found, nil
		}
		seq, err := strconv.ParseUint(last.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("an event without its sequence: %w", err)
		}
		req.Seq, req.StartTime, req.Batch = seq+1, nil, eventReadBatch
	}
}

// legacyEvents reads every event type's latest event of request id as written before
// ADR 10, one subject per request and type.
func (q *Queue) legacyEvents(ctx context.Context, id string) ([]request.Event, error) {
	batch := 4 * len(request.EventTypes)
	msgs, err := DirectBatch(ctx, q.nc, EventStream, struct {
		MultiLast []string `json:"multi_last"`
		Batch     int      `json:"batch"`
	}{[]string{request.LegacyEventFilter(id)}, batch}, batch)
	if err != nil {
		return nil, fmt.Errorf("reading events of %s: %w", id, err)
	}
	var out []request.Event
	for _, m := range msgs {
		var e request.Event
		if err := json.Unmarshal(m.Data, &e); err != nil || e.ID != id {
			continue // not written by this service
		}
		out = append(out, e)
	}
	return out, nil
}

// Status reads the status of request id of client clientID from its events, and for a queued request where it
// stands in its client's queue.
func (q *Queue) Status(ctx context.Context, clientID, id string) (request.Status, error) {
	events, err := q.Events(ctx, clientID, id)
	if err != nil {
		return request.Status{}, err
	}
	st := request.StatusOf(id, events)
	st.Queue = q.Place(ctx, st)
	return st, nil
}

// Place says where a queued request stands in its client's queue: its client's backlog,
// and whether it is at the head. Nil when it is not queued, or that cannot be read (the
// status stands without it).
func (q *Queue) Place(ctx context.Context, st request.Status) *request.QueuePlace {
	if st.State != request.StateQueued || st.ClientID == "" || st.Seq == 0 {
		return nil
	}
	subject, n, ok, err := q.ClientSubject(ctx, st.ClientID)
	if err != nil || !ok {
		return nil
	}
	place := &request.QueuePlace{Backlog: n}
	if q.cfg.NoBodyReads {
		place.AtHead = n == 1
	} else if head, ok, err := q.Head(ctx, subject); err == nil && ok {
		place.AtHead = head.Seq == st.Seq
	}
	return place
}

// WatchEvents calls fn for every event written for request id of client clientID from
// now on, until the returned stop is called. It listens on the client's event subjects
// as they are published (no consumer): an event written while it is not listening is not
// heard, so a caller reads the status after starting the watch.
func (q *Queue) WatchEvents(clientID, id string, fn func(request.Event)) (stop func(), err error) {
	if err := request.ValidateID(id); err != nil {
		return nil, err
	}
	if err := request.ValidateClientID(clientID); err != nil {
		return nil, err
	}
	sub, err := q.nc.Subscribe(request.ClientEventFilter(clientID), func(m *nats.Msg) {
		if h := m.Header.Get(request.EventIDHeader); h != "" && h != id {
			return
		}
		var e request.Event
		if json.Unmarshal(m.Data, &e) == nil && e.ID == id {
			fn(e)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("watching events of %s: %w", id, err)
	}
	return func() { _ = sub.Unsubscribe() }, nil
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
	eventBatch         = 2048
	eventAckWait       = 5 * time.Second
	eventRetryMax      = time.Second
)

// NewEventWriter returns a writer for this queue's events stream; instance names the
// writing process in each event. buffer bounds the events waiting (DefaultEventBuffer
// if zero). Start its loop with Run.
func (q *Queue) NewEventWriter(instance string, buffer int, reg prometheus.Registerer, log zerolog.Logger) *EventWriter {
	if buffer <= 0 {
		buffer = DefaultEventBuffer
	}
	return &EventWriter{js: q.js, log: log.With().Str("component", "events").Logger(), instance: instance,
		in: make(chan queuedEvent, buffer), metrics: newEventMetrics(reg)}
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
	w.mu.Lock()
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
			w.log.Error().Str("request_id", e.ID).Str("type", e.Type).
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
	futures := make([]jetstream.PubAckFuture, len(batch))
	errs := make([]error, len(batch))
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

func eventMsg(e request.Event) *nats.Msg {
	m := nats.NewMsg(e.Subject())
	m.Header.Set(request.EventIDHeader, e.ID)
	m.Data, _ = json.Marshal(e)
	return m
}

// eventMsgID makes a write retried after its acknowledgement was lost land once. An
// attempt's event holds its time too: two alike in all else (an attempt numbered 1 again
// by a restarted dispatcher of the same name) are two attempts, both written. Other
// events do not: a request sent again with its Idempotency-Key is not accepted again.
func eventMsgID(e request.Event) string {
	id := e.ID + ":" + e.Type + ":" + strconv.Itoa(e.Cycle) + ":" + strconv.Itoa(e.Attempt) + ":" + strconv.FormatUint(e.Seq, 10) + ":" + e.Instance
	if e.Type == request.EventAttemptStarted || e.Type == request.EventAttemptFailed {
		id += ":" + strconv.FormatInt(e.At.UnixNano(), 36)
	}
	return id
}

type eventMetrics struct {
	written, retried, dropped prometheus.Counter
}

func newEventMetrics(reg prometheus.Registerer) eventMetrics {
	m := eventMetrics{
		written: prometheus.NewCounter(prometheus.CounterOpts{Name: "dispatch_events_written_total", Help: "Request events written to the events stream."}),
		retried: prometheus.NewCounter(prometheus.CounterOpts{Name: "dispatch_events_retried_total", Help: "Event writes that failed and were retried."}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "dispatch_events_dropped_total", Help: "Events dropped because the writer's buffer was full (the events stream not taking writes for long): those requests' statuses lag."}),
	}
	if reg != nil {
		reg.MustRegister(m.written, m.retried, m.dropped)
	}
	return m
}
