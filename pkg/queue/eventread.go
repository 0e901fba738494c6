package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// EventReadTimeout bounds a read of a request's events when its context has no deadline
// of its own.
const EventReadTimeout = 5 * time.Second

// Reading a request's events (ADR 10): its client's events from the request's time on.
const (
	// eventProbes is how many of a scan's first events are read one direct get each,
	// before it reads in batches of eventReadBatch. A single get costs the server the
	// message; a batched one also counts what is pending after it (Nats-Num-Pending), and
	// for a literal subject that is a walk over every block from where the read starts to
	// the subject's last message, loading each whose subject state expired (two minutes
	// unused): an hour-old request of an active client costs dozens of block loads. Most
	// reads find what they look for in their first event or two (an idle client's
	// final); a backlogged client's read goes on in batches.
	eventProbes    = 3
	eventReadBatch = 256
	// eventClockMargin is how much earlier than where a request's events start they
	// are read from: the id's time is ingest's clock, the events' times the store's, so
	// it is how far apart those clocks may be. Each of its blocks of the store that no
	// read touched for two minutes, the server loads whole (4 MB) to find the client's
	// events in it: at 20,000 requests/s two seconds are six blocks, half a second one
	// or two (a tenth of a second measured no faster: BENCHMARKS.md). Clocks kept by NTP
	// are milliseconds apart; clocks further apart cost a second read
	// (eventClockMarginWide), not a wrong status.
	eventClockMargin = 500 * time.Millisecond
	// eventClockMarginWide is the margin of a second read when the first found nothing:
	// clocks further apart than eventClockMargin cost that read (ADR 10).
	eventClockMarginWide = 10 * time.Minute
)

// Events reads the events of request id of client clientID (ADR 10): its client's events
// from the request's time on, until its final event, with those of a replay. A request
// id made by NewID holds its time; a keyed one does not, and its client's events are
// read from the start of the record, every copy's (ADR 18: no acceptance is stored to
// say where the latest copy's start); request.StatusOf takes the latest copy's. No
// events: an empty list.
func (q *Queue) Events(ctx context.Context, clientID, id string) ([]request.Event, error) {
	return q.events(ctx, clientID, id, false)
}

// StatusEvents reads the events of request id of client clientID that its status
// follows from (request.StatusOf gives the same status as from Events): once the
// request's delivery is found, neither its client's other final events nor its attempts
// are read. Each subject read is a walk by the server to the client's next event there,
// however far (ADR 10): a delivered request, the usual one read, spares four of them.
func (q *Queue) StatusEvents(ctx context.Context, clientID, id string) ([]request.Event, error) {
	return q.events(ctx, clientID, id, true)
}

func (q *Queue) events(ctx context.Context, clientID, id string, status bool) ([]request.Event, error) {
	if err := request.ValidateID(id); err != nil {
		return nil, err
	}
	if err := request.ValidateClientID(clientID); err != nil {
		return nil, err
	}
	ctx, cancel := readTimeout(ctx)
	defer cancel()
	r := eventRead{q: q, id: id, client: clientID, status: status, seen: map[uint64]bool{}}
	if err := r.read(ctx); err != nil {
		return nil, fmt.Errorf("reading events of %s: %w", id, err)
	}
	var out []request.Event
	for _, e := range r.events {
		out = append(out, e.Event)
	}
	return out, nil
}

// readTimeout bounds a read of the events stream by EventReadTimeout when ctx has no
// deadline: a direct get is a plain request, and an answer that never comes (a responder
// that went away mid-read) would hold the caller for as long as its context lasts.
func readTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, EventReadTimeout)
}

// ClientOfEvents finds the client of request id from the events stream alone, for an
// operator who has only the id: it reads every client's events stored from a moment
// before the id's time, at most clientSearchEvents of them, for the id's first. Best
// effort: false for a keyed id (it holds no time), for one whose first event came after
// that many others, or that has none (queued and not attempted yet: the queue has it).
func (q *Queue) ClientOfEvents(ctx context.Context, id string) (string, bool, error) {
	at, ok := request.IDTime(id)
	if !ok {
		return "", false, nil
	}
	ctx, cancel := readTimeout(ctx)
	defer cancel()
	found, err := q.scanEvents(ctx, scan{filter: request.EventPrefix + ">", id: id,
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
	// status: read only what the request's status follows from (StatusEvents).
	status bool
	seen   map[uint64]bool // stream sequences already taken
	events []storedEvent
}

// storedEvent is an event with where and when the stream stored it.
type storedEvent struct {
	request.Event
	seq uint64
	at  time.Time
}

// read reads the request's events, in the order stored.
func (r *eventRead) read(ctx context.Context) error {
	err := r.readFrom(ctx, eventClockMargin)
	if _, timed := request.IDTime(r.id); timed && err == nil && len(r.events) == 0 {
		err = r.readFrom(ctx, eventClockMarginWide)
	}
	slices.SortFunc(r.events, func(a, b storedEvent) int { return cmp.Compare(a.seq, b.seq) })
	return err
}

// readFrom reads the request's events from margin before where they start, each type
// from its subject: in one round trip its replays and its delivery; in a second its
// other final events (dead-lettered, purged, cancelled; not for a status once it is
// delivered); in a third its attempts, up to its final event (not for a status of a
// delivered request). A keyed id's scans end at none of its finals: an earlier copy's
// may come before the latest copy's events.
func (r *eventRead) readFrom(ctx context.Context, margin time.Duration) error {
	subject := func(typ request.EventType) string { return request.ClientEventSubject(r.client, typ) }
	from, keyed := r.start(margin)
	var floor uint64 // a replay's sequence: a final of an earlier cycle does not count
	final := func(cycle int, floor uint64) func(storedEvent) bool {
		return func(e storedEvent) bool { return !keyed && e.Cycle >= cycle && (e.Seq == 0 || e.Seq >= floor) }
	}
	found, err := r.scanAll(ctx, from, []scan{
		{filter: subject(request.EventReplayed)},
		{filter: subject(request.EventDelivered), stop: final(0, 0)},
	})
	if err != nil {
		return err
	}
	cycle, replay := latestReplay(found[0])
	if replay != nil {
		floor = replay.Seq
	}
	finals := found[1]
	// Delivered, as most requests read are: for a status, its other final subjects and
	// its attempts change nothing (the delivery says how many attempts it took).
	delivered := r.status && slices.ContainsFunc(finals, final(cycle, floor))
	if !delivered {
		more, err := r.scanAll(ctx, from, r.undelivered(final(0, 0)))
		if err != nil {
			return err
		}
		finals = slices.Concat(finals, slices.Concat(more...))
	}
	if replay != nil && !keyed && !slices.ContainsFunc(finals, final(cycle, floor)) {
		from = made(*replay).Add(-margin)
		again, err := r.finalsFrom(ctx, from, final(cycle, floor))
		if err != nil {
			return err
		}
		finals = slices.Concat(finals, again)
	}
	for _, f := range found {
		r.take(f)
	}
	r.take(finals)
	// Its attempts, up to its final event if it has one (a later attempt event of it
	// does not change its state), else to the end.
	var until uint64
	if i := slices.IndexFunc(finals, final(cycle, floor)); i >= 0 {
		if r.status && finals[i].Type == request.EventDelivered {
			return nil
		}
		until = finals[i].seq
	}
	attempts, err := r.scanAll(ctx, from, []scan{
		{filter: subject(request.EventAttemptStarted), until: until},
		{filter: subject(request.EventAttemptFailed), until: until},
	})
	if err != nil {
		return err
	}
	r.take(slices.Concat(attempts...))
	return nil
}

// latestReplay is the latest of replays, and its cycle (0 and nil for none): its cycle's
// events are the ones that count, from when it was made (right after the request was
// queued again).
func latestReplay(replays []storedEvent) (cycle int, replay *storedEvent) {
	for i, e := range replays {
		if e.Cycle > cycle {
			cycle, replay = e.Cycle, &replays[i]
		}
	}
	return cycle, replay
}

// start is where the request's events are read from: margin before its id's time, or
// for a keyed id (which holds no time, keyed true) the start of the record.
func (r *eventRead) start(margin time.Duration) (from time.Time, keyed bool) {
	at, timed := request.IDTime(r.id)
	if !timed {
		return time.Time{}, true
	}
	return at.Add(-margin), false
}

// undelivered is the scans of the request's final events but a delivery, each ending at
// the first event that stop takes.
func (r *eventRead) undelivered(stop func(storedEvent) bool) []scan {
	subject := func(typ request.EventType) string { return request.ClientEventSubject(r.client, typ) }
	return []scan{
		{filter: subject(request.EventDeadLettered), stop: stop},
		{filter: subject(request.EventPurged), stop: stop},
		{filter: subject(request.EventCancelled), stop: stop},
	}
}

// finalsFrom reads the request's final events of every type from from on, each type's
// scan ending at the first that stop takes: those of its latest replay's cycle.
func (r *eventRead) finalsFrom(ctx context.Context, from time.Time, stop func(storedEvent) bool) ([]storedEvent, error) {
	subject := func(typ request.EventType) string { return request.ClientEventSubject(r.client, typ) }
	found, err := r.scanAll(ctx, from, append([]scan{{filter: subject(request.EventDelivered), stop: stop}}, r.undelivered(stop)...))
	if err != nil {
		return nil, err
	}
	return slices.Concat(found...), nil
}

// take keeps found events not taken yet (read puts them in the order stored).
func (r *eventRead) take(found []storedEvent) {
	for _, e := range found {
		if !r.seen[e.seq] {
			r.seen[e.seq] = true
			r.events = append(r.events, e)
		}
	}
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
		Batch     int        `json:"batch,omitempty"`
	}
	req := get{NextFor: sc.filter, Seq: 1}
	if !sc.from.IsZero() {
		req.StartTime, req.Seq = &sc.from, 0
	}
	var found []storedEvent
	read := 0
	for {
		var msgs []*nats.Msg
		var err error
		if read < eventProbes {
			var m *nats.Msg
			if m, err = DirectGet(ctx, q.nc, EventStream, req); m != nil {
				msgs = []*nats.Msg{m}
			}
		} else {
			req.Batch = eventReadBatch
			msgs, err = DirectBatch(ctx, q.nc, EventStream, req, req.Batch)
		}
		if err != nil {
			return nil, err
		}
		read += len(msgs)
		for _, m := range msgs {
			seq, _ := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
			if sc.until > 0 && seq > sc.until {
				return found, nil
			}
			e, ok := eventOf(m, sc.id)
			if !ok {
				continue
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
		req.Seq, req.StartTime = seq+1, nil
	}
}
