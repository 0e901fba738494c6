package ingest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Canceller asks the dispatchers to cancel a queued request: the one that owns its
// client decides (ADR 13). The queue is one.
type Canceller interface {
	AskCancel(ctx context.Context, clientID, id string) (request.CancelAnswer, error)
}

// maxCancels bounds the cancels one ingest has the dispatchers working on at once (each
// is a search of the client's queue by the owner), a token at most its share of them,
// and cancelTimeout each.
const (
	maxCancels    = 16
	cancelTimeout = 4 * time.Second
)

// cancel answers DELETE /v1/requests/{id}?clientId=: the request leaves its client's
// queue unsent, if it is queued and not in flight. 200 with its status (cancelled; again
// for a request cancelled already, so that a retried DELETE reads the same), 409 when
// an attempt is under way or it has ended otherwise, 404 when it is unknown, 503 with
// Retry-After when it cannot be decided now.
func (a *API) cancel(w http.ResponseWriter, r *http.Request, scope *Scope) {
	id, clientID, _, p := requestNamed(r, "a cancel", "")
	if p != nil {
		writeProblem(w, *p)
		return
	}
	if a.cancels == nil {
		writeProblem(w, problem{Status: http.StatusNotImplemented, Code: "cancel_unsupported", Detail: "this ingest cannot reach the dispatchers to cancel a request"})
		return
	}
	if !scope.Allows(clientID) {
		// Another tenant's request reads as one never sent, as its status does.
		writeProblem(w, notQueued(id, clientID))
		return
	}
	release, refusal, ok := a.takeSlot(scope, a.cancelSlots, 0)
	switch {
	case refusal != nil:
		writeProblem(w, *refusal)
		return
	case !ok:
		writeProblem(w, problem{Status: http.StatusServiceUnavailable, Code: "overloaded", RetryAfter: time.Second,
			Detail: fmt.Sprintf("%d cancels are being decided already; retry after the Retry-After delay", maxCancels)})
		return
	}
	defer release()
	ctx, cancel := context.WithTimeout(r.Context(), cancelTimeout)
	defer cancel()
	ans, err := a.cancels.AskCancel(ctx, clientID, id)
	switch {
	case errors.Is(err, request.ErrNoDispatcher):
		writeProblem(w, problem{Status: http.StatusServiceUnavailable, Code: "no_dispatcher", RetryAfter: 5 * time.Second,
			Detail: "no dispatcher is running to cancel the request; it stays queued. Retry after the Retry-After delay"})
		return
	case errors.Is(err, request.ErrNoOwner):
		writeProblem(w, problem{Status: http.StatusServiceUnavailable, Code: "cancel_unavailable", RetryAfter: time.Second,
			Detail: "no dispatcher owns the request's client just now (its partition is changing hands); it stays queued. Retry after the Retry-After delay"})
		return
	case err != nil:
		if r.Context().Err() != nil {
			return // the caller left
		}
		a.log.Warn().Err(err).Str("request_id", id).Msg("cancel not decided")
		writeProblem(w, problem{Status: http.StatusServiceUnavailable, Code: "cancel_unavailable", RetryAfter: time.Second,
			Detail: "the cancel could not be decided just now; the request stays as it was (read its status). Retry after the Retry-After delay"})
		return
	}
	switch ans.Outcome {
	case request.CancelCancelled:
		a.log.Info().Str("client_id", clientID).Str("request_id", id).Str("dispatcher", ans.Instance).Msg("request cancelled")
		writeJSON(w, http.StatusOK, ans.Status(clientID, id))
		return
	case request.CancelInFlight:
		writeProblem(w, problem{Status: http.StatusConflict, Code: "in_flight",
			Detail: "an attempt of the request is under way (or it is being dead-lettered): raven may receive it, and it can no longer be cancelled. Read its status for how it ends"})
		return
	case request.CancelHandover:
		writeProblem(w, problem{Status: http.StatusServiceUnavailable, Code: "cancel_unavailable", RetryAfter: max(time.Until(ans.Until), time.Second),
			Detail: "the request's client changed dispatcher a moment ago, and the earlier one may still be sending it; retry after the Retry-After delay"})
		return
	}
	// Not queued: ended, or never accepted. Its record says which.
	if a.cfg.Status == nil {
		writeProblem(w, notQueued(id, clientID))
		return
	}
	st, err := a.readStatus(ctx, w, clientID, id, 0, scope, false, nil)
	switch {
	case err != nil:
		writeProblem(w, problem{Status: http.StatusServiceUnavailable, Code: "status_unavailable", RetryAfter: time.Second,
			Detail: "the request is not queued, and its status could not be read just now to say why; retry after the Retry-After delay"})
	case st.State == request.StateCancelled:
		writeJSON(w, http.StatusOK, st)
	case st.State == request.StateUnknown:
		writeProblem(w, notQueued(id, clientID))
	default:
		writeProblem(w, problem{Status: http.StatusConflict, Code: "not_cancellable",
			Detail: fmt.Sprintf("the request is no longer queued: its status is %s. Read it for raven's answer", statusWord(st))})
	}
}

// statusWord is a final status in a few words.
func statusWord(st request.Status) string {
	if st.State == request.StateDeadLettered && st.DeadLetter != nil {
		return string(st.State) + " (" + string(st.DeadLetter.Reason) + ")"
	}
	if !st.Final() {
		return string(st.State) + " (it has just left the queue; its final status follows)"
	}
	return string(st.State)
}

func notQueued(id, clientID string) problem {
	return problem{Status: http.StatusNotFound, Code: "not_found",
		Detail: fmt.Sprintf("no request %s of client %q is queued or known: check the id and the clientId (the 202 answer gave both)", id, clientID)}
}
