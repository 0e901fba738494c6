package schedule

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Outcome is what an attempt came to, as raven's answer makes it: the "outcome" label of
// dispatch_attempts_total, and of the console's attempts.
type Outcome string

// The outcomes of an attempt.
const (
	OutcomeDelivered Outcome = "delivered"
	OutcomeTransient Outcome = "transient_failure"
	OutcomePermanent Outcome = "permanent_failure"
)

// Outcomes lists every outcome.
var Outcomes = []Outcome{OutcomeDelivered, OutcomeTransient, OutcomePermanent}

// Decision is what one attempt's answer means, decided here only: its outcome, what
// becomes of the request (Kind: Delivered, Retry or DeadLettered, with the Reason), and
// what raven's budget learns from it. The dispatcher settles it (removes the request,
// dead-letters it, or has the lane retry) and observes it (events, metrics, activity,
// spans) apart.
type Decision struct {
	Outcome Outcome
	Kind    Kind
	// Reason is why the request is dead-lettered, for DeadLettered.
	Reason request.Reason
	// RetryAfter is raven's Retry-After, for a Retry; zero when it gave none.
	RetryAfter time.Duration
	// Refused says raven refused the attempt as overloaded (429, 503, or a timeout), and
	// PauseAll, for a 503 with Retry-After, how long it asked every sender to wait.
	Refused  bool
	PauseAll time.Duration
}

// Decide says what an attempt means, from the send's error alone, read by the shared
// words (request's error types, wrapped or not): none is delivered, a
// request.PermanentError is permanent, and any other is transient, retried unless the
// policy gives up on it (attempt is the try just made, first when the first one started,
// end when this one ended).
func (p Policy) Decide(err error, attempt int, first, end time.Time) Decision {
	d := Decision{Outcome: outcomeOf(err)}
	d.Refused, d.PauseAll = overloaded(err, request.RavenStatus(err))
	switch d.Outcome {
	case OutcomeDelivered:
		d.Kind = Delivered
	case OutcomePermanent:
		d.Kind, d.Reason = DeadLettered, request.ReasonPermanent
	default:
		if d.Reason = p.GiveUp(attempt, first, end); d.Reason != "" {
			d.Kind = DeadLettered
			break
		}
		d.Kind = Retry
		var tr *request.TransientError
		if errors.As(err, &tr) {
			d.RetryAfter = tr.After
		}
	}
	return d
}

func outcomeOf(err error) Outcome {
	var perm *request.PermanentError
	switch {
	case err == nil:
		return OutcomeDelivered
	case errors.As(err, &perm):
		return OutcomePermanent
	default:
		return OutcomeTransient
	}
}

// overloaded says whether an attempt's failure says raven is overloaded (429, 503, or
// a timeout), and for a 503 with Retry-After how long raven asked every sender to wait.
func overloaded(err error, status int) (bool, time.Duration) {
	switch {
	case err == nil:
		return false, 0
	case status == http.StatusServiceUnavailable:
		var tr *request.TransientError
		if errors.As(err, &tr) {
			return true, tr.After
		}
		return true, 0
	case status == http.StatusTooManyRequests:
		return true, 0
	case status == 0 && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, request.ErrNoAnswerInTime)):
		return true, 0
	}
	return false, 0
}
