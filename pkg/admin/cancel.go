package admin

import (
	"context"
	"errors"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// ServeCancels has dispatcher d answer the cancels asked of the dispatchers (ingest's
// DELETE, the admin API, dispatchctl) for the clients whose partitions it owns, until
// stop is called (ADR 13).
func ServeCancels(q *queue.Queue, d *dispatch.Dispatcher, instance string, log zerolog.Logger) (stop func(), err error) {
	return q.ServeCancels(func(ctx context.Context, subject, id string) (request.CancelAnswer, bool) {
		var res dispatch.CancelResult
		lane, err := request.LaneOf(subject)
		if err == nil {
			res, err = d.Cancel(ctx, lane, id)
		}
		a := request.CancelAnswer{Instance: instance}
		switch {
		case err != nil && !errors.Is(err, dispatch.ErrCancelLate) && ctx.Err() != nil:
			return a, false // out of time: the asker has given up
		case err != nil:
			log.Warn().Err(err).Str("request_id", id).Msg("cancel not decided")
			a.Error = err.Error()
			return a, true
		}
		if res.Outcome == dispatch.CancelNotOwner {
			return a, false
		}
		a.Outcome = res.Outcome.String() // the queue's Cancel* words are these
		a.At, a.Until = res.At, res.Until
		a.Queued = request.QueuedOf(res.Request)
		return a, true
	})
}

// CancelOutcome is what a cancel did, as the admin API and dispatchctl say it.
type CancelOutcome struct {
	// State is the request's state after the cancel: cancelled, or what it was when the
	// cancel could not be made.
	State  request.State   `json:"state"`
	Detail string          `json:"detail"`
	Record *request.Status `json:"record,omitempty"`
}

// Cancel cancels request id of clientID: the dispatcher that owns the client removes it
// from its queue, unsent, unless an attempt is under way. It answers a *Conflict when
// the request cannot be cancelled (in flight, or ended), a *NotFound when it is unknown.
func (s *Service) Cancel(ctx context.Context, clientID, id string) (CancelOutcome, error) {
	if err := request.ValidateID(id); err != nil {
		return CancelOutcome{}, invalid("id %q: %s", id, err)
	}
	if err := request.ValidateClientID(clientID); err != nil {
		return CancelOutcome{}, invalid("client: %s", err)
	}
	a, err := s.q.AskCancel(ctx, clientID, id)
	switch {
	case errors.Is(err, request.ErrNoDispatcher):
		return CancelOutcome{}, unavailable("no dispatcher is running to cancel it")
	case errors.Is(err, request.ErrNoOwner):
		return CancelOutcome{}, unavailable("no dispatcher owns the client's partition just now (a handover); try again in a few seconds")
	case err != nil:
		return CancelOutcome{}, unavailable("%s", err)
	}
	switch a.Outcome {
	case request.CancelCancelled:
		st := a.Status(clientID, id)
		return CancelOutcome{State: StateCancelled, Record: &st, Detail: "cancelled by " + a.Instance + ": it left its client's queue unsent, and raven never receives it"}, nil
	case request.CancelInFlight:
		return CancelOutcome{}, conflict("an attempt of %s is under way (or it is being dead-lettered): raven may receive it; see its status", id)
	case request.CancelHandover:
		return CancelOutcome{}, unavailable("the client's partition changed hands lately and an attempt by its earlier dispatcher may still be under way; try again after %s", a.Until.UTC().Format("15:04:05.000Z"))
	}
	// Not queued: it ended, or never was. Its record says which.
	if rec := s.record(ctx, clientID, id); rec != nil {
		if rec.State == request.StateCancelled {
			return CancelOutcome{State: StateCancelled, Record: rec, Detail: "cancelled already"}, nil
		}
		return CancelOutcome{}, conflict("%s is no longer queued: its status is %s", id, rec.State)
	}
	return CancelOutcome{}, notFound("%s is not queued for client %q, and has no status record: check the id and the client", id, clientID)
}
