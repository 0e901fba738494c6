package admin

import (
	"context"
	"fmt"
	"time"

	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// Request states: those of its status record (request.State...).
const (
	StateQueued       = request.StateQueued
	StateInFlight     = request.StateInFlight
	StateDeadLettered = request.StateDeadLettered
	StateDelivered    = request.StateDelivered
	StateCancelled    = request.StateCancelled
	StateUnknown      = request.StateUnknown
)

// RequestState is where one request is.
type RequestState struct {
	ID         string               `json:"id"`
	State      request.State        `json:"state"`
	Detail     string               `json:"detail"`
	ClientID   string               `json:"clientId,omitempty"`
	AcceptedAt time.Time            `json:"acceptedAt,omitzero"`
	Position   *int64               `json:"position,omitempty"` // requests ahead of it in its client's queue
	Lane       *schedule.LaneInfo   `json:"lane,omitempty"`
	Dispatcher string               `json:"dispatcher,omitempty"`
	DeadLetter *request.DeadLetter  `json:"deadLetter,omitempty"`
	Delivery   *introspect.Delivery `json:"delivery,omitempty"`
	// Record is its status record, as GET /v1/requests/{id} on ingest answers it; nil
	// when it has none (not attempted yet, ADR 18; or with EVENTS=false).
	Record *request.Status `json:"record,omitempty"`
}

// Request says where the request with this id is: from its status record (its events)
// first, then from its client's queue and the dead-letter stream. clientID, if given,
// narrows those searches to that client; without it and without a record, the queue is
// not searched (it would mean reading every queued request).
func (s *Service) Request(ctx context.Context, id, clientID string) (RequestState, error) {
	if id == "" {
		return RequestState{}, invalid("a request id is required")
	}
	if clientID != "" {
		if err := request.ValidateClientID(clientID); err != nil {
			return RequestState{}, invalid("client: %s", err)
		}
	}
	rec := s.record(ctx, clientID, id)
	if clientID == "" && request.ValidateID(id) == nil {
		// The record is kept by client: find the client from the id's first event.
		if c, ok, err := s.q.ClientOfEvents(ctx, id); err == nil && ok {
			clientID, rec = c, s.record(ctx, c, id)
		}
	}
	rs, err := s.where(ctx, id, clientID, rec)
	if rec == nil && clientID == "" && rs.ClientID != "" {
		// Found by id alone (a dead letter, a recent delivery): its client names its record.
		rs.Record = s.record(ctx, rs.ClientID, id)
	} else {
		rs.Record = rec
	}
	return rs, err
}

// record reads the request's status record: it is kept by client (ADR 10). Nil without
// clientID, when there is none, or when it cannot be read (no events stream: EVENTS=false);
// the searches still answer.
func (s *Service) record(ctx context.Context, clientID, id string) *request.Status {
	if clientID == "" || request.ValidateID(id) != nil {
		return nil
	}
	st, err := s.q.Status(ctx, clientID, id)
	if err != nil || st.State == request.StateUnknown {
		return nil
	}
	return &st
}

// where finds the request in its client's queue or dead letters, and among the
// dispatchers' recent deliveries; rec, if not nil, is its status record, which says
// where to look and stands when it is found nowhere.
func (s *Service) where(ctx context.Context, id, clientID string, rec *request.Status) (RequestState, error) {
	// A request not attempted yet has no record (ADR 18): by its id alone, the whole queue
	// is searched for it (headers only; an operator's question, not a hot path).
	searchQueue := (clientID != "" && (rec == nil || !rec.Final())) || (clientID == "" && rec == nil)
	if searchQueue {
		if rs, ok, err := s.queued(ctx, id, clientID); err != nil || ok {
			return rs, err
		}
	}
	if rec == nil || rec.State == request.StateDeadLettered {
		if rs, ok, err := s.deadLettered(ctx, id, clientID); err != nil || ok {
			return rs, err
		}
	}
	if rs, ok := s.sent(ctx, id); ok {
		return rs, nil
	}
	if rec != nil {
		rs := RequestState{ID: id, State: rec.State, ClientID: rec.ClientID, AcceptedAt: rec.AcceptedAt, Detail: "as its status record says"}
		switch rec.State {
		case request.StateDelivered:
			rs.Detail = fmt.Sprintf("raven accepted it at %s, after %s (status %d)", rec.DeliveredAt.UTC().Format(time.RFC3339Nano), Count(rec.Attempts, "attempt", "attempts"), rec.RavenStatus)
		case request.StateDeadLettered:
			rs.Detail = "dead-lettered (" + string(rec.DeadLetter.Reason) + "), and no longer in the dead-letter stream: replayed, or removed"
		case request.StateCancelled:
			rs.Detail = fmt.Sprintf("cancelled at %s: it left its client's queue unsent, and raven never receives it", rec.CancelledAt.UTC().Format(time.RFC3339Nano))
		}
		return rs, nil
	}
	detail := "no status record (events are kept for STATUS_RETENTION), not among the dead letters, nor among the running dispatchers' recent deliveries: check the id (ingest's 202 gives it)"
	if clientID == "" {
		detail += "; give its client (-client) to read its status record and search that client's queue"
	}
	return RequestState{ID: id, State: StateUnknown, Detail: detail}, nil
}

// queued finds the request in its client's queue, and asks the dispatchers about its lane.
func (s *Service) queued(ctx context.Context, id, clientID string) (RequestState, bool, error) {
	f, ok, err := s.q.FindRequest(ctx, id, clientID)
	if err != nil || !ok {
		return RequestState{}, false, err
	}
	rs := RequestState{ID: id, State: StateQueued, ClientID: f.ClientID, AcceptedAt: f.AcceptedAt}
	if f.Position >= 0 {
		rs.Position = &f.Position
	}
	head, hok, _ := s.head(ctx, f.Subject)
	isHead := hok && head.Seq == f.Seq
	if l, ok := s.lanes(ctx, []string{f.Subject})[f.Subject]; ok {
		rs.Lane, rs.Dispatcher = &l.LaneInfo, l.instance
		if isHead && l.State == schedule.LaneInFlight {
			rs.State = StateInFlight
		}
	}
	switch {
	case rs.State == StateInFlight:
		rs.Detail = "at the head of its client's queue, with a dispatcher now"
	case isHead:
		rs.Detail = "at the head of its client's queue; see lane.nextSend"
	default:
		rs.Detail = "queued behind earlier requests of its client"
	}
	return rs, true, nil
}

// deadLettered finds the request's latest dead letter: a request dead-lettered, replayed
// and dead-lettered again has more than one.
func (s *Service) deadLettered(ctx context.Context, id, clientID string) (RequestState, bool, error) {
	var dead *request.DeadLetter
	for r, err := range s.q.DeadLetters(ctx, queue.DeadFilter{ID: id, ClientID: clientID}) {
		if err != nil {
			return RequestState{}, false, err
		}
		r.Body = nil
		dead = &r
	}
	if dead == nil {
		return RequestState{}, false, nil
	}
	return RequestState{ID: id, State: StateDeadLettered, ClientID: dead.ClientID, AcceptedAt: dead.AcceptedAt, DeadLetter: dead,
		Detail: "in the dead-letter stream (" + string(dead.Reason) + "); replay puts it back in its client's queue"}, true, nil
}

// sent asks the dispatchers whether one of them delivered the request lately.
func (s *Service) sent(ctx context.Context, id string) (RequestState, bool) {
	for _, a := range ask[introspect.DeliveredAnswer](ctx, s, introspect.DeliveredQuestion{IDs: []string{id}}) {
		if len(a.Delivered) == 0 {
			continue
		}
		d := a.Delivered[0]
		rs := RequestState{ID: id, State: StateDelivered, Dispatcher: a.Instance, Delivery: &d,
			Detail: fmt.Sprintf("raven accepted it at %s, on attempt %d", d.Delivered.UTC().Format(time.RFC3339Nano), d.Attempt)}
		rs.ClientID, _ = request.ClientIDOf(d.Subject)
		return rs, true
	}
	return RequestState{}, false
}

// head reads the oldest request queued on a request subject (the queue's, as a listing
// or a lookup gave it).
func (s *Service) head(ctx context.Context, subject string) (request.Stored, bool, error) {
	lane, err := request.LaneOf(subject)
	if err != nil {
		return request.Stored{}, false, err
	}
	return s.q.Head(ctx, lane)
}
