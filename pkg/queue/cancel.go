package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// cancelSubject is where a cancel is asked of the dispatchers (ingest's DELETE, the
// admin API, dispatchctl cancel). Every dispatcher hears it; the one that owns the
// client's partition decides and answers, the others keep quiet (ADR 13). Core NATS
// request/reply: the decision is stored by the owner itself (the cancelled event and the
// removal), never by the asker.
const cancelSubject = "dispatch.ctl.cancel"

// maxCancelWork bounds a dispatcher's work on one cancel (the search of the client's
// queue and the removal), whatever the asker says; maxCancelsAtOnce bounds the cancels
// one dispatcher works on at once (more are not answered: the asker sees no owner).
const (
	maxCancelWork    = 5 * time.Second
	maxCancelsAtOnce = 16
)

// ServeCancels answers cancels on cancelSubject with decide, given the subject the
// client's requests are stored on, until stop is called. decide says answer false when
// this dispatcher does not own the client: it keeps quiet, and the owner answers.
func (q *Queue) ServeCancels(decide func(ctx context.Context, subject, id string) (a request.CancelAnswer, answer bool)) (stop func(), err error) {
	slots := make(chan struct{}, maxCancelsAtOnce)
	sub, err := q.nc.Subscribe(cancelSubject, func(m *nats.Msg) {
		ask, within, ok := readAsk(m, maxCancelWork)
		if !ok {
			return // not asked by this service (the asker times out), or given up
		}
		select {
		case slots <- struct{}{}:
		default:
			return
		}
		go func() {
			defer func() { <-slots }()
			ctx, cancel := context.WithTimeout(context.Background(), within)
			defer cancel()
			a, ok := decide(ctx, q.StoredSubject(ask.ClientID), ask.ID)
			if !ok {
				return
			}
			b, _ := json.Marshal(a)
			_ = m.Respond(b)
		}()
	})
	if err != nil {
		return nil, fmt.Errorf("serving cancels: %w", err)
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// AskCancel asks the dispatchers to cancel request id of client clientID, and gives the
// owner's answer. request.ErrNoDispatcher: none runs; request.ErrNoOwner: none answered within ctx (or
// maxCancelWork). An answer with Error set is returned as an error.
func (q *Queue) AskCancel(ctx context.Context, clientID, id string) (request.CancelAnswer, error) {
	if err := request.ValidateClientID(clientID); err != nil {
		return request.CancelAnswer{}, err
	}
	if err := request.ValidateID(id); err != nil {
		return request.CancelAnswer{}, err
	}
	var a request.CancelAnswer
	if err := q.askDispatchers(ctx, cancelSubject, clientID, id, maxCancelWork, &a); err != nil {
		if errors.Is(err, request.ErrNoDispatcher) || errors.Is(err, request.ErrNoOwner) {
			return request.CancelAnswer{}, err
		}
		return request.CancelAnswer{}, fmt.Errorf("asking the dispatchers to cancel %s: %w", id, err)
	}
	if a.Error != "" {
		return a, fmt.Errorf("the dispatcher %s cancelling %s: %s", a.Instance, id, a.Error)
	}
	return a, nil
}
