package request

import (
	"errors"
	"time"
)

// The outcomes of a cancel, as CancelAnswer.Outcome says them (and as the dispatcher's
// CancelOutcome prints them).
const (
	CancelCancelled = "cancelled"  // it left the queue unsent; raven never receives it
	CancelInFlight  = "in_flight"  // an attempt is under way (or it is being dead-lettered)
	CancelNotQueued = "not_queued" // not in its client's queue: it ended, or was never accepted
	CancelHandover  = "handover"   // the client's partition changed hands lately; ask again after Until
)

// CancelAnswer is the answer of the dispatcher that owns a request's client to a cancel
// of the request (ADR 13).
type CancelAnswer struct {
	Outcome  string `json:"outcome"`
	Instance string `json:"instance"`
	// For CancelCancelled: what the request was, and when its removal landed.
	Queued
	At time.Time `json:"at,omitzero"`
	// Until is, for CancelHandover, when an earlier owner's attempts have surely ended.
	Until time.Time `json:"until,omitzero"`
	// Error says the owner could not decide (the queue did not answer in time, say).
	Error string `json:"error,omitempty"`
}

// Status is the cancelled request's status, for CancelCancelled.
func (a CancelAnswer) Status(clientID, id string) Status {
	st := a.Queued.Status(clientID, id, StateCancelled)
	st.CancelledAt, st.UpdatedAt = a.At, a.At
	return st
}

// The errors of an ask of the running dispatchers (a queued request's lookup, a cancel).
var (
	// ErrNoDispatcher: no dispatcher answered; none is running.
	ErrNoDispatcher = errors.New("no dispatcher answered")
	// ErrNoOwner: dispatchers run but none answered a cancel in time: the client's
	// partition has no owner just now (a handover, or every dispatcher busy).
	ErrNoOwner = errors.New("no dispatcher owns the request's client just now")
)
