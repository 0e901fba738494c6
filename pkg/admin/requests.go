package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// Request states.
const (
	StateQueued       = "queued"
	StateInFlight     = "in_flight"
	StateDeadLettered = "dead_lettered"
	StateSent         = "sent"
	StateNotQueued    = "not_queued"
)

// RequestState is where one request is.
type RequestState struct {
	ID         string              `json:"id"`
	State      string              `json:"state"`
	Detail     string              `json:"detail"`
	ClientID   string              `json:"client_id,omitempty"`
	AcceptedAt time.Time           `json:"accepted_at,omitzero"`
	Position   *int64              `json:"position,omitempty"` // requests ahead of it in its client's queue
	Lane       *dispatch.LaneInfo  `json:"lane,omitempty"`
	Dispatcher string              `json:"dispatcher,omitempty"`
	DeadLetter *request.DeadLetter `json:"dead_letter,omitempty"`
	Delivery   *dispatch.Delivery  `json:"delivery,omitempty"`
}

// Request says where the request with this id is. clientID, if given, narrows the
// search to that client's queue, which is much faster on a large backlog.
func (s *Service) Request(ctx context.Context, id, clientID string) (RequestState, error) {
	if id == "" {
		return RequestState{}, invalid("a request id is required")
	}
	if clientID != "" {
		if err := request.ValidateClientID(clientID); err != nil {
			return RequestState{}, invalid("client: %s", err)
		}
	}
	if rs, ok, err := s.queued(ctx, id, clientID); err != nil || ok {
		return rs, err
	}
	if rs, ok, err := s.deadLettered(ctx, id, clientID); err != nil || ok {
		return rs, err
	}
	if rs, ok := s.sent(ctx, id); ok {
		return rs, nil
	}
	return RequestState{ID: id, State: StateNotQueued,
		Detail: "neither queued, nor dead-lettered, nor among the running dispatchers' recent deliveries: raven accepted it a while ago, or it was never accepted (check the id; ingest's 202 gives it)"}, nil
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
	head, hok, _ := s.q.Head(ctx, f.Subject)
	isHead := hok && head.Seq == f.Seq
	if l, ok := s.lanes(ctx, []string{f.Subject})[f.Subject]; ok {
		rs.Lane, rs.Dispatcher = &l.LaneInfo, l.instance
		if isHead && l.State == dispatch.LaneInFlight {
			rs.State = StateInFlight
		}
	}
	switch {
	case rs.State == StateInFlight:
		rs.Detail = "at the head of its client's queue, with a dispatcher now"
	case isHead:
		rs.Detail = "at the head of its client's queue; see lane.next_send"
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
		Detail: "in the dead-letter stream (" + dead.Reason + "); replay puts it back in its client's queue"}, true, nil
}

// sent asks the dispatchers whether one of them delivered the request lately.
func (s *Service) sent(ctx context.Context, id string) (RequestState, bool) {
	answers, err := s.q.QueryLanes(ctx, queue.LaneQuery{IDs: []string{id}}, s.laneWait)
	if err != nil {
		return RequestState{}, false
	}
	for _, raw := range answers {
		var a dispatch.LaneAnswer
		if json.Unmarshal(raw, &a) != nil || len(a.Delivered) == 0 {
			continue
		}
		d := a.Delivered[0]
		rs := RequestState{ID: id, State: StateSent, Dispatcher: a.Instance, Delivery: &d,
			Detail: fmt.Sprintf("raven accepted it at %s, on attempt %d", d.Delivered.UTC().Format(time.RFC3339Nano), d.Attempt)}
		rs.ClientID, _ = request.ClientIDOf(d.Subject)
		return rs, true
	}
	return RequestState{}, false
}
