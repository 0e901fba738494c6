package ingest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// status answers GET /v1/requests/{id}?clientId=: the request's status from its events,
// which are kept by client (ADR 10), so the read names the client as well. With
// ?wait=30s it holds the answer until the request reaches a final state (delivered,
// dead_lettered) or the wait ends, and answers with the status as it is then; unknown
// (no such request) is answered at once. A wait
// over MaxStatusWait is cut to it, and the answer says so in WaitCappedHeader: a long
// poll that asks for more is still answered, and its caller can tell why it came back
// sooner than asked.
func (a *API) status(w http.ResponseWriter, r *http.Request, scope *Scope) {
	if a.cfg.Status == nil {
		writeProblem(w, problem{Status: http.StatusNotImplemented, Code: "status_disabled",
			Detail: "request status is off on this ingest (EVENTS=false): turn events on to read statuses"})
		return
	}
	id, clientID, query, p := requestNamed(r, "a status read", "; statuses are kept by client")
	if p != nil {
		writeProblem(w, *p)
		return
	}
	var wait time.Duration
	if v := query.Get("wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil && durationForm.MatchString(v) { // too long to hold: 9999999999h
			d, err = a.cfg.MaxStatusWait+1, nil // longer than any cap, which cuts it as it cuts 1h
		}
		if err != nil || d < 0 {
			writeProblem(w, *badRequest("wait_invalid", fmt.Sprintf("wait %q: give a duration such as 30s (at most %s)", truncate(v, 32), a.cfg.MaxStatusWait)))
			return
		}
		wait = d
		if d > a.cfg.MaxStatusWait {
			wait = a.cfg.MaxStatusWait
			w.Header().Set(WaitCappedHeader, wait.String())
		}
	}
	// A slot for the read, within the token's share: waiting reads and plain ones each
	// have their bound.
	slots := a.reads
	if wait > 0 {
		slots = a.waits
	}
	release, refusal, ok := a.takeSlot(scope, slots, scope.readShare())
	switch {
	case refusal != nil:
		a.answerProblem(w, *refusal)
		return
	case !ok:
		detail := fmt.Sprintf("%d status reads are being read already (MAX_STATUS_READS); retry after the Retry-After delay", a.cfg.MaxStatusReads)
		if wait > 0 {
			detail = fmt.Sprintf("%d status reads are waiting already (MAX_STATUS_WAITS); read without ?wait, or retry after the Retry-After delay", a.cfg.MaxStatusWaits)
		}
		writeProblem(w, problem{Status: http.StatusServiceUnavailable, Code: "overloaded", RetryAfter: time.Second, Detail: detail})
		return
	}
	defer release()
	st, err := a.readStatus(r.Context(), w, clientID, id, wait, scope, true, nil)
	if err != nil {
		if r.Context().Err() != nil {
			return // the caller left
		}
		a.log.Debug().Err(err).Str("request_id", id).Msg("status read failed")
		var unknowable *unknowable
		switch {
		case errors.As(err, &unknowable) && unknowable.refusal != nil:
			a.answerProblem(w, *unknowable.refusal)
		case errors.As(err, &unknowable):
			writeProblem(w, problem{Status: http.StatusServiceUnavailable, Code: "status_unavailable", RetryAfter: time.Second,
				Detail: "there is no record of this request, and no dispatcher answered whether it is queued (none runs, or none in time): its status cannot be known now; retry after the Retry-After delay"})
		default:
			writeProblem(w, problem{Status: http.StatusServiceUnavailable, Code: "status_unavailable", RetryAfter: time.Second,
				Detail: "the request's status could not be read just now; retry after the Retry-After delay"})
		}
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// durationForm is a positive Go duration's form (time.ParseDuration's): one that has it
// and does not parse is too long to hold, more than any cap rather than a mistake.
var durationForm = regexp.MustCompile(`^\+?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$`)

// requestNamed reads the request a call names: its id in the path and its client in
// ?clientId= (what, such as "a status read", is said in the problem when one is
// missing, with why), and the query it came in.
func requestNamed(r *http.Request, what, why string) (id, clientID string, query url.Values, p *problem) {
	id = chi.URLParam(r, "id")
	if err := request.ValidateID(id); err != nil {
		return "", "", nil, badRequest("id_invalid", fmt.Sprintf("%q is not a request id: %s", truncate(id, 64), err))
	}
	query, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil { // else the clientId, or the wait, could be dropped and its absence answered
		return "", "", nil, badRequest("query_invalid", fmt.Sprintf("the query string cannot be read (%s): separate its parameters with & and percent-encode what needs it: ?clientId=<its clientId>", truncate(err.Error(), 128)))
	}
	for _, name := range []string{"clientId", "wait"} {
		if len(query[name]) > 1 { // which one was meant is a guess
			return "", "", nil, badRequest("query_invalid", fmt.Sprintf("?%s= is given %d times; give it once", name, len(query[name])))
		}
	}
	clientID = query.Get("clientId")
	if clientID == "" {
		return "", "", nil, badRequest("client_id_missing", fmt.Sprintf("%s names the request's client as well: %s /v1/requests/%s?clientId=<its clientId> (the 202 answer gave both)%s", what, r.Method, id, why))
	}
	if err := request.ValidateClientID(clientID); err != nil {
		return "", "", nil, badRequest("client_id_invalid", fmt.Sprintf("clientId %q: %s", truncate(clientID, 64), err))
	}
	return id, clientID, query, nil
}

// WaitCappedHeader is on a status answer whose ?wait was over MaxStatusWait
// (MAX_STATUS_WAIT): the wait it was held for at most, as a Go duration ("1m0s").
const WaitCappedHeader = "Wait-Capped"

// readStatus reads id's status; with wait, again at each of its events until it is
// final or the wait ends. The watch starts before the first read, so that no event falls
// between the two, and the events it hears count with those read: one heard may not be
// readable yet.
//
// lookup adds what a status read answers beyond the record: a request without one found
// in the queue (askQueued), and a queued request's place. A POST waiting for its own
// request's end (Prefer: wait) needs neither: it knows the request is stored, and
// answers only a final status.
//
// heard is a watch of id's events already running (a POST's with Prefer: wait, started
// before its request was stored), which a wait uses instead of starting another; nil
// when there is none.
func (a *API) readStatus(ctx context.Context, w http.ResponseWriter, clientID, id string, wait time.Duration, scope *Scope, lookup bool, heard *watching) (request.Status, error) {
	if !scope.Allows(clientID) {
		// Another tenant's request reads as one never sent: its id says nothing.
		return request.StatusOf(id, nil), nil
	}
	watch := &watching{}
	var timer, reread *time.Timer
	every := firstReread
	if wait > 0 {
		// The server's write timeout is for answers that do not wait: this one may.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + 10*time.Second))
		if watch = heard; watch == nil {
			var err error
			if watch, err = a.watch(clientID, id); err != nil {
				return request.Status{}, err
			}
			defer watch.stop()
		}
		timer = time.NewTimer(wait)
		defer timer.Stop()
		// The watch hears only what is published once its subscription is in place, and
		// an event published a moment before that may be stored only after the first read
		// (the stream stores, and with fsync on syncs, after it passes a message on):
		// neither sees it. So the record is read again a few times while that can
		// happen, sooner first (0.25, 0.75, 1.75 and 3.75 s in): such a final event is then
		// found within a quarter of a second, not at the end of the wait. What the watch
		// hears is merged with the last read; it is not a reason to read the record again.
		reread = time.NewTimer(every)
		defer reread.Stop()
	}
	asked, queued := !lookup, request.StatusOf(id, nil) // queued: the queue's answer, once asked
	var stored []request.Event                          // the record as last read
	for read := true; ; {
		if read {
			var err error
			if stored, err = a.record(ctx, clientID, id); err != nil {
				return request.Status{}, err
			}
			read = false
		}
		events := append(slices.Clip(stored), watch.events()...)
		st := request.StatusOf(id, events)
		switch {
		case st.State != request.StateUnknown:
		case !asked:
			asked = true // once a read: the answer does not change while it waits
			var err error
			if st, err = a.fromQueue(ctx, scope, st, clientID, id); err != nil {
				return request.Status{}, err
			}
			queued = st
		default: // still no record: the queue's answer stands (its outcome is recorded before it leaves, ADR 9)
			st = queued
		}
		// Unknown, the queue asked, is no such request (a clientId in the wrong case, an id
		// never accepted or past the retention): waiting does not change it.
		if wait <= 0 || st.Final() || lookup && st.State == request.StateUnknown {
			return a.placed(ctx, st, lookup), nil
		}
		select {
		case <-watch.changed: // merged above, from what the watch heard
		case <-reread.C:
			read = true
			if every < lastReread {
				every *= 2
				reread.Reset(every)
			}
		case <-timer.C:
			// The wait is over: the answer is the record as it is now, read once more (a
			// watch may miss an event, in a reconnect, after the re-reads have stopped).
			wait, read = 0, true
		case <-ctx.Done():
			return st, ctx.Err()
		}
	}
}

// record reads the events of request id of client clientID that its status follows
// from, within statusReadTimeout.
func (a *API) record(ctx context.Context, clientID, id string) ([]request.Event, error) {
	ctx, cancel := context.WithTimeout(ctx, statusReadTimeout)
	defer cancel()
	return a.cfg.Status.StatusEvents(ctx, clientID, id)
}

// firstReread and lastReread space a waiting read's own reads of the record, beside its
// watch: a quarter of a second after it began, then twice as long each time, the last
// lastReread after the one before. Past that, whatever was published before the watch
// began has long been stored.
const (
	firstReread = 250 * time.Millisecond
	lastReread  = 2 * time.Second
)

// watching is a watch of one request's events: those heard so far, and a signal at each.
type watching struct {
	mu      sync.Mutex
	heard   []request.Event
	changed chan struct{} // nil: not watching
	stop    func()
}

// watch starts watching request id of clientID's events from now on.
func (a *API) watch(clientID, id string) (*watching, error) {
	wt := &watching{changed: make(chan struct{}, 1)}
	stop, err := a.cfg.Status.WatchEvents(clientID, id, func(e request.Event) {
		wt.mu.Lock()
		wt.heard = append(wt.heard, e)
		wt.mu.Unlock()
		select {
		case wt.changed <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return nil, err
	}
	wt.stop = stop
	return wt, nil
}

// events are the events heard so far.
func (wt *watching) events() []request.Event {
	wt.mu.Lock()
	defer wt.mu.Unlock()
	return slices.Clone(wt.heard)
}

// fromQueue is the status of a request without a record (st): queued, as the dispatchers
// find it in the queue, or unknown when they answer that the queue does not hold it.
// Unknown is an answer only the queue can give: when the dispatchers cannot be asked, the
// error says so, and the status is not known (saying unknown would be a guess).
func (a *API) fromQueue(ctx context.Context, scope *Scope, st request.Status, clientID, id string) (request.Status, error) {
	f, ok, err := a.askQueued(ctx, scope, clientID, id)
	switch {
	case err != nil:
		return st, err
	case ok:
		return f.Status(clientID, id), nil
	}
	// Not queued: it left the queue since the record was read, or it is unknown. A
	// request's outcome is stored before it leaves the queue: in the record, or kept in
	// the request stream while the events stream does not take it (ADR 9; f.Kept). The
	// record is read again, a few times over about a second: a direct get may be
	// answered by a replica a moment behind its leader.
	for _, pause := range recordRereads {
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return st, ctx.Err()
		}
		rctx, cancel := context.WithTimeout(ctx, statusReadTimeout)
		events, err := a.cfg.Status.StatusEvents(rctx, clientID, id)
		cancel()
		if err != nil {
			return st, err
		}
		if events = append(events, f.Kept...); len(events) > 0 {
			return request.StatusOf(id, events), nil
		}
	}
	return st, nil
}

// recordRereads are the pauses before each read of the record of a request the
// dispatchers found not queued, before it is answered unknown.
var recordRereads = []time.Duration{0, 100 * time.Millisecond, 300 * time.Millisecond, 600 * time.Millisecond}

// askQueued looks for a request without a status record in the queue itself, through
// the dispatchers (its NATS user may not read queued requests): a request delayed, or
// held behind a delayed one, for longer than STATUS_RETENTION is found for as long as it
// is queued, whatever the retention. At most maxQueuedAsks at once on this ingest (each
// is a scan of the client's queue's headers by a dispatcher), and the token (scope) at
// most its share of them. ok says the dispatchers found it queued; an error (an
// *unknowable) that they could not be asked or did not answer: whether it is queued is
// not known.
func (a *API) askQueued(ctx context.Context, scope *Scope, clientID, id string) (f request.Found, ok bool, err error) {
	release, refusal, ok := a.takeSlot(scope, a.asks, 0)
	if !ok {
		if refusal == nil {
			refusal = &problem{Status: http.StatusServiceUnavailable, Code: "overloaded", RetryAfter: time.Second,
				Detail: fmt.Sprintf("%d lookups of requests without a record are being asked of the dispatchers already; retry after the Retry-After delay", maxQueuedAsks)}
		}
		return request.Found{}, false, &unknowable{refusal: refusal, err: errors.New("no slot to ask the dispatchers")}
	}
	defer release()
	ctx, cancel := context.WithTimeout(ctx, queuedAskTimeout)
	defer cancel()
	f, ok, err = a.cfg.Status.AskQueued(ctx, clientID, id)
	if err != nil {
		return request.Found{}, false, &unknowable{err: err}
	}
	return f, ok, nil
}

// unknowable is why a request without a record could not be looked for in the queue;
// with a refusal, the answer to give (the token's share, or the bound, of such asks).
type unknowable struct {
	refusal *problem
	err     error
}

func (u *unknowable) Error() string {
	return "whether the request is queued is not known: " + u.err.Error()
}
func (u *unknowable) Unwrap() error { return u.err }

// maxQueuedAsks bounds the asks one ingest has the dispatchers working on at once, and
// queuedAskTimeout each: an id that is unknown to the record is rare (a request delayed
// past the retention, one accepted a few milliseconds ago, a mistyped id), and a caller
// sending many must not keep the dispatchers scanning.
const (
	maxQueuedAsks    = 8
	queuedAskTimeout = 2 * time.Second
)

// placed adds where a queued request stands in its client's queue, if that can be read
// within statusReadTimeout (the status stands without it).
func (a *API) placed(ctx context.Context, st request.Status, place bool) request.Status {
	if !place {
		return st
	}
	ctx, cancel := context.WithTimeout(ctx, statusReadTimeout)
	defer cancel()
	st.Queue = a.cfg.Status.Place(ctx, st)
	return st
}

// statusReadTimeout bounds each read of the store a status read makes.
const statusReadTimeout = 5 * time.Second
