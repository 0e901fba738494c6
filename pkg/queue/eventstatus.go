package queue

import (
	"context"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// A request's status from its events, and its place in its client's queue.

// Status reads the status of request id of client clientID from its events, and for a
// queued request where it stands in its client's queue.
func (q *Queue) Status(ctx context.Context, clientID, id string) (request.Status, error) {
	events, err := q.StatusEvents(ctx, clientID, id)
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
	lane, n, ok, err := q.ClientLane(ctx, st.ClientID)
	if err != nil || !ok {
		return nil
	}
	place := &request.QueuePlace{Backlog: n}
	if q.cfg.NoBodyReads {
		place.AtHead = n == 1
	} else if head, ok, err := q.Head(ctx, lane); err == nil && ok {
		place.AtHead = head.Seq == st.Seq
	}
	return place
}
