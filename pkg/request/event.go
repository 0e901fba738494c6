package request

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"
)

// EventPrefix starts every event subject: "dispatch.events.<client token>.<type>", the
// client token as in request subjects, and the request's id in the EventIDHeader (ADR
// 10): the store holds a subject per client and event type, never one per request.
// Penguin follows one client with "dispatch.events.<token>.>", one kind of outcome with
// "dispatch.events.*.delivered", and one request by its client's subjects and the id
// header.
const EventPrefix = "dispatch.events."

// EventIDHeader names the request an event is about, so that a reader of a client's
// events can pick one request's without decoding the others.
const EventIDHeader = "Dispatch-Request-Id"

// EventType is what happened to a request: one per outcome in its life.
type EventType string

// The event types.
const (
	// EventAccepted: ingest stored the request. Live only (ADR 18): ingest publishes it
	// to whoever listens on its client's subjects, and the events stream does not store
	// it; the queued request is the record of its acceptance.
	EventAccepted EventType = "accepted"
	// EventAttemptStarted: a dispatcher started an attempt to raven.
	EventAttemptStarted EventType = "attempt_started"
	// EventAttemptFailed: an attempt failed transiently; the request will be retried.
	EventAttemptFailed EventType = "attempt_failed"
	// EventDelivered: raven accepted the request and it left the queue.
	EventDelivered EventType = "delivered"
	// EventDeadLettered: the request went to the dead-letter stream (Reason says why).
	EventDeadLettered EventType = "dead_lettered"
	// EventPurged: an operator purged the client's backlog; the request went to the
	// dead-letter stream unsent.
	EventPurged EventType = "purged"
	// EventReplayed: an operator replayed the dead letter: the request is queued again,
	// at the end of its client's queue.
	EventReplayed EventType = "replayed"
	// EventCancelled: penguin (or an operator) cancelled the request while it was queued
	// and not in flight; it left the queue unsent and is not dead-lettered.
	EventCancelled EventType = "cancelled"
)

// EventTypes lists every event type.
var EventTypes = []EventType{EventAccepted, EventAttemptStarted, EventAttemptFailed, EventDelivered, EventDeadLettered, EventPurged, EventReplayed, EventCancelled}

// StoredEventTypes lists the event types the events stream stores: every type but
// EventAccepted (ADR 18).
var StoredEventTypes = EventTypes[1:]

// Event is one outcome of one request, as the events stream holds it (JSON).
type Event struct {
	Type     EventType `json:"type"`
	ID       string    `json:"id"`
	ClientID string    `json:"clientId"`
	At       time.Time `json:"at"`
	// Cycle counts the request's replays: 0 until it is first replayed. The events of the
	// latest cycle say where the request is.
	Cycle int `json:"cycle"`
	// Attempt is the attempt's number (attempt events; delivered and dead_lettered: the
	// last attempt's). A dispatcher that takes a client over counts on from the record's
	// (ADR 17).
	Attempt int `json:"attempt,omitempty"`
	// Status is raven's HTTP status, when it answered.
	Status int `json:"status,omitempty"`
	// Error is why an attempt failed without an answer from raven (or with one, briefly).
	Error string `json:"error,omitempty"`
	// Reason is why it was dead-lettered: one of the Reason constants.
	Reason Reason `json:"reason,omitempty"`
	// Seq is the request's sequence in the request stream (accepted and replayed).
	Seq uint64 `json:"seq,omitempty"`
	// NotBefore is the earliest the request may be attempted, when it has one.
	NotBefore time.Time `json:"notBefore,omitzero"`
	// NotAfter is when the request stops being sent, when it has one.
	NotAfter time.Time `json:"notAfter,omitzero"`
	// AcceptedAt is when the queue first stored the request (accepted, and carried on
	// later events where known).
	AcceptedAt time.Time `json:"acceptedAt,omitzero"`
	// Instance is the dispatcher (or ingest) that wrote it.
	Instance string `json:"instance,omitempty"`
	// BodyDigest identifies the body of a request sent with an Idempotency-Key (its final
	// events, ADR 18): a copy sent with another body is refused, not taken for the same
	// request, also once the first has left the queue.
	BodyDigest string `json:"bodyDigest,omitempty"`
	// Duplicate marks an accepted event of a request the queue had stored already under
	// the same id (an Idempotency-Key sent again within the duplicate window): that copy
	// was stored up to the window before, and may have been delivered meanwhile.
	Duplicate bool `json:"duplicate,omitempty"`
	// Response is raven's answer to the attempt (delivered, attempt_failed, and
	// dead_lettered after an attempt), as much of it as the dispatcher keeps.
	Response *Response `json:"response,omitempty"`
}

// JSON is the event as the stores hold it: JSON without HTML escaping, so that raven's
// answer kept in it (an HTML or XML body) is not written six bytes for each <, > or &.
func (e Event) JSON() []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(e) // an Event always encodes
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// Subject is where the event is published: its client's subject for its type.
func (e Event) Subject() string {
	return EventPrefix + EncodeClientID(e.ClientID) + "." + string(e.Type)
}

// ClientEventFilter is the subject filter of every event of clientID's requests.
func ClientEventFilter(clientID string) string {
	return EventPrefix + EncodeClientID(clientID) + ".*"
}

// ClientEventSubject is the subject of clientID's events of type typ.
func ClientEventSubject(clientID string, typ EventType) string {
	return EventPrefix + EncodeClientID(clientID) + "." + string(typ)
}

// Final says whether the event ends its cycle: nothing more happens to the request
// unless an operator replays it.
func (e Event) Final() bool {
	return e.Type == EventDelivered || e.Type == EventDeadLettered || e.Type == EventPurged || e.Type == EventCancelled
}

// IDTime is when a request id was made, for ids NewID made; false for keyed ids
// (IDFromKey), which carry no time.
func IDTime(id string) (time.Time, bool) {
	if len(id) != 26 {
		return time.Time{}, false
	}
	b, err := idEncoding.DecodeString(id)
	if err != nil || len(b) < 6 {
		return time.Time{}, false
	}
	var ms uint64
	for _, c := range b[:6] {
		ms = ms<<8 | uint64(c)
	}
	return time.UnixMilli(int64(ms)), true
}

// ErrIDInvalid is returned for a request id that ingest never gives out.
var ErrIDInvalid = errors.New("a request id is the 26 characters ingest answered with (or \"k\" and 26 for one sent with an Idempotency-Key), of 0-9 and a-z without i, l, o, u")

// ValidateID checks that id has the shape of a request id. It keeps ids that are not a
// single subject token (".", "*", ">", spaces) out of subject filters.
func ValidateID(id string) error {
	body := strings.TrimPrefix(id, "k")
	if len(body) != 26 {
		return ErrIDInvalid
	}
	for i := 0; i < len(body); i++ {
		if strings.IndexByte(idAlphabet, body[i]) < 0 {
			return ErrIDInvalid
		}
	}
	return nil
}

const idAlphabet = "0123456789abcdefghjkmnpqrstvwxyz"

// State is where a request is, as its status says.
type State string

// The states of a request.
const (
	StateQueued       State = "queued"
	StateInFlight     State = "in_flight"
	StateDelivered    State = "delivered"
	StateDeadLettered State = "dead_lettered"
	StateCancelled    State = "cancelled"
	StateUnknown      State = "unknown"
)

// Status is where a request is, worked out from its events (StatusOf).
type Status struct {
	ID          string       `json:"id"`
	ClientID    string       `json:"clientId,omitempty"`
	State       State        `json:"status"`
	AcceptedAt  time.Time    `json:"acceptedAt,omitzero"`
	NotBefore   time.Time    `json:"notBefore,omitzero"`
	NotAfter    time.Time    `json:"notAfter,omitzero"`
	Attempts    int          `json:"attempts"`
	LastAttempt *AttemptInfo `json:"lastAttempt,omitempty"`
	DeliveredAt time.Time    `json:"deliveredAt,omitzero"`
	// CancelledAt is when a cancel removed it from the queue, unsent (state cancelled).
	CancelledAt time.Time `json:"cancelledAt,omitzero"`
	RavenStatus int       `json:"ravenStatus,omitempty"`
	// Response is raven's answer to the latest attempt it answered: the delivery's, the
	// one that dead-lettered it, or while it is retried the last failed one's.
	Response   *Response   `json:"response,omitempty"`
	DeadLetter *DeadInfo   `json:"deadLetter,omitempty"`
	Replays    int         `json:"replays"`
	Queue      *QueuePlace `json:"queue,omitempty"`
	UpdatedAt  time.Time   `json:"updatedAt,omitzero"`
	// Seq is the request's sequence in the request stream while it is queued (not shown:
	// for looking it up there).
	Seq uint64 `json:"-"`
}

// AttemptInfo is the latest attempt of a request.
type AttemptInfo struct {
	At     time.Time `json:"at"`
	Status int       `json:"status,omitempty"`
	Error  string    `json:"error,omitempty"`
}

// DeadInfo says why a request is in the dead-letter stream.
type DeadInfo struct {
	Reason     Reason    `json:"reason"`
	At         time.Time `json:"at"`
	LastStatus int       `json:"lastStatus,omitempty"`
	LastError  string    `json:"lastError,omitempty"`
	// Replayable: an operator can put it back in its client's queue (dispatchctl replay).
	Replayable bool `json:"replayable"`
}

// QueuePlace is where a queued request stands in its client's queue.
type QueuePlace struct {
	// Backlog is how many requests the client has queued, this one included.
	Backlog uint64 `json:"backlog"`
	// AtHead: it is the next of its client's requests to go.
	AtHead bool `json:"atHead"`
}

// Final says whether the state is one a request stays in unless replayed.
func (s Status) Final() bool {
	return s.State == StateDelivered || s.State == StateDeadLettered || s.State == StateCancelled
}

// StatusOf works out a request's status from its events, in whatever order they were
// stored: events are written by several processes (ingest, dispatchers, replay), each
// retrying a failed write, so one can land after a later one. The latest cycle counts,
// and in it the latest stored copy's events (a key reused after the duplicate window
// makes a new copy with the same id); among those, a final event wins; else the latest attempt event (by At); else accepted
// or replayed: queued. No events: unknown.
func StatusOf(id string, events []Event) Status {
	st := Status{ID: id, State: StateUnknown}
	if len(events) == 0 {
		return st
	}
	cycle := 0
	for _, e := range events {
		cycle = max(cycle, e.Cycle)
		if st.AcceptedAt.IsZero() && !e.AcceptedAt.IsZero() {
			st.AcceptedAt = e.AcceptedAt
		}
		if e.At.After(st.UpdatedAt) {
			st.UpdatedAt = e.At
		}
		if st.ClientID == "" {
			st.ClientID = e.ClientID
		}
	}
	st.Replays = cycle
	cur := slices.DeleteFunc(slices.Clone(events), func(e Event) bool { return e.Cycle != cycle })
	// An Idempotency-Key sent again after the duplicate window makes a new request with
	// the same id: its events and the earlier one's share their subjects, and only the
	// latest stored copy's (the highest sequence) count. Events without a sequence
	// (written by an earlier version) count with any.
	var seq uint64
	for _, e := range cur {
		seq = max(seq, e.Seq)
	}
	cur = slices.DeleteFunc(cur, func(e Event) bool { return e.Seq != 0 && e.Seq != seq })
	slices.SortStableFunc(cur, func(a, b Event) int { return a.At.Compare(b.At) })
	var final, attempt, queued *Event
	for i := range cur {
		e := &cur[i]
		switch {
		case e.Final():
			final = e
		case e.Type == EventAttemptStarted || e.Type == EventAttemptFailed:
			attempt = e
		default:
			queued = e
		}
		if e.Type == EventAttemptStarted || e.Type == EventAttemptFailed || e.Final() && e.Attempt > 0 {
			st.Attempts = max(st.Attempts, e.Attempt)
		}
		if !e.NotBefore.IsZero() {
			st.NotBefore = e.NotBefore
		}
		if !e.NotAfter.IsZero() {
			st.NotAfter = e.NotAfter
		}
		if e.Response != nil {
			st.Response = e.Response
		}
		if e.Seq != 0 {
			st.Seq = e.Seq
		}
	}
	st.settle(final, attempt, queued)
	if st.Final() {
		st.Seq = 0
	}
	return st
}

// settle sets the state st is in from the latest copy's final event, latest attempt
// event and acceptance or replay (each nil when there is none).
func (st *Status) settle(final, attempt, queued *Event) {
	if attempt != nil {
		st.LastAttempt = &AttemptInfo{At: attempt.At, Status: attempt.Status, Error: attempt.Error}
	}
	switch {
	case final != nil && final.Type == EventDelivered:
		st.State, st.DeliveredAt, st.RavenStatus = StateDelivered, final.At, final.Status
		st.LastAttempt = &AttemptInfo{At: final.At, Status: final.Status}
	case final != nil && final.Type == EventCancelled:
		st.State, st.CancelledAt = StateCancelled, final.At
	case final != nil:
		st.State = StateDeadLettered
		st.DeadLetter = &DeadInfo{Reason: final.Reason, At: final.At, LastStatus: final.Status, LastError: final.Error,
			Replayable: final.Reason != ReasonUndecodable}
		if endedByAttempt(final, attempt) {
			st.LastAttempt = &AttemptInfo{At: final.At, Status: final.Status, Error: final.Error}
		}
	case attempt != nil && attempt.Type == EventAttemptStarted:
		st.State = StateInFlight
	case attempt != nil, queued != nil:
		st.State = StateQueued
	}
}

// endedByAttempt says whether the dead letter final carries the outcome of an attempt
// that no attempt event has told (the attempt that dead-letters a request writes no
// attempt_failed): a reason an attempt's answer decides, of an attempt later than the
// latest one failed. An expired or purged request's dead letter counts its earlier
// attempts, but was decided by no attempt.
func endedByAttempt(final, attempt *Event) bool {
	switch final.Reason {
	case ReasonPermanent, ReasonAttemptsExhausted, ReasonAgeExhausted:
	default:
		return false
	}
	return final.Attempt > 0 && (attempt == nil || final.Attempt > attempt.Attempt ||
		final.Attempt == attempt.Attempt && attempt.Type == EventAttemptStarted)
}

// Recordable says whether e names a request this service stored, and so may be kept in
// the record: one published straight to a request subject may have any id, which must
// not become part of an event's subject or record.
func (e Event) Recordable() bool { return e.ClientID != "" && ValidateID(e.ID) == nil }
