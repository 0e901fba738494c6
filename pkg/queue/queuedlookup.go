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

// queuedSubject is where the dispatchers say whether a request is queued, for a status
// read that found no record of it: a request delayed, or held behind a delayed one,
// for longer than STATUS_RETENTION has outlived its accepted event, and is still found
// in the queue itself, for as long as it is queued. Ingest's NATS user may not read
// queued requests (SECURITY.md), so it asks: one dispatcher of the queue group answers
// with what the headers say, never the body. Core NATS request/reply: nothing is stored.
const queuedSubject = "dispatch.ctl.queued"

// queuedGroup is the dispatchers' queue group on queuedSubject: one answers each ask.
const queuedGroup = "dispatchers"

// dispatcherAsk is a question about one request asked of the dispatchers (whether it is
// queued; a cancel).
type dispatcherAsk struct {
	ClientID string `json:"clientId"`
	ID       string `json:"id"`
	// WithinMs is how long the asker waits for the answer, in milliseconds: the
	// dispatcher gives up then (at most its own bound), relative so that clocks apart do
	// not matter.
	WithinMs int64 `json:"withinMs"`
}

// readAsk decodes an ask from m and says how long it may take (at most most); ok false
// for one this service did not send, or whose asker has given up: it is not answered.
func readAsk(m *nats.Msg, most time.Duration) (ask dispatcherAsk, within time.Duration, ok bool) {
	if json.Unmarshal(m.Data, &ask) != nil || request.ValidateClientID(ask.ClientID) != nil || request.ValidateID(ask.ID) != nil {
		return ask, 0, false
	}
	within = min(time.Duration(ask.WithinMs)*time.Millisecond, most)
	return ask, within, within > 0
}

// maxQueuedScan bounds a dispatcher's scan for an ask, whatever the asker says.
const maxQueuedScan = 5 * time.Second

type queuedAnswer struct {
	Found bool   `json:"found"`
	Seq   uint64 `json:"seq,omitempty"`
	request.Queued
	// Kept are the request's final events kept in the request stream, for one not
	// queued: it left the queue while the events stream did not take them (ADR 9).
	Kept  []request.Event `json:"kept,omitempty"`
	Error string          `json:"error,omitempty"`
}

// ServeQueuedLookups answers asks on queuedSubject (AskQueued) from this queue's
// request stream (lookupQueued), at most maxQueuedLookups at once, until stop is called.
// A dispatcher serves them.
func (q *Queue) ServeQueuedLookups() (stop func(), err error) {
	slots := make(chan struct{}, maxQueuedLookups)
	sub, err := q.nc.QueueSubscribe(queuedSubject, queuedGroup, func(m *nats.Msg) {
		ask, within, ok := readAsk(m, maxQueuedScan)
		if !ok {
			return // not asked by this service (the asker times out), or given up
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), within)
			defer cancel()
			select {
			case slots <- struct{}{}:
				defer func() { <-slots }()
			case <-ctx.Done():
				return // the asker has given up (and answers 503 status_unavailable)
			}
			s, ok, err := q.lookupQueued(ctx, ask.ID, ask.ClientID)
			ans := queuedAnswer{Found: ok}
			if !ok && err == nil {
				ans.Kept, err = q.keptOutcomes(ctx, ask.ID, ask.ClientID)
			}
			switch {
			case err != nil:
				ans.Error = err.Error()
			case ok:
				ans.Seq, ans.Queued = s.Seq, request.QueuedOf(s)
			}
			b, _ := json.Marshal(ans)
			_ = m.Respond(b)
		}()
	})
	if err != nil {
		return nil, fmt.Errorf("serving queued lookups: %w", err)
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// maxQueuedLookups bounds the lookups one dispatcher works on at once; past it, an ask
// waits for one to end, as long as its asker waits.
const maxQueuedLookups = 32

// askDispatchers asks the dispatchers on subject about request id of clientID, within
// ctx's deadline (at most most), and decodes the first answer into answer.
// request.ErrNoDispatcher: none listens; request.ErrNoOwner: none answered in time.
func (q *Queue) askDispatchers(ctx context.Context, subject, clientID, id string, most time.Duration, answer any) error {
	within := most
	if by, has := ctx.Deadline(); has {
		within = min(time.Until(by), most)
	}
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	b, _ := json.Marshal(dispatcherAsk{ClientID: clientID, ID: id, WithinMs: within.Milliseconds()})
	m, err := q.nc.RequestWithContext(ctx, subject, b)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return request.ErrNoDispatcher
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
		return request.ErrNoOwner
	case err != nil:
		return err
	}
	return json.Unmarshal(m.Data, answer)
}

// AskQueued asks the dispatchers whether request id of client clientID is queued, and
// if so gives what the queue says of it (its status: f.Status; its place in the queue
// is Place's to say). ok is false when it is not queued; f.Kept then holds its final
// events still kept in the request stream, if any.
func (q *Queue) AskQueued(ctx context.Context, clientID, id string) (f request.Found, ok bool, err error) {
	if err := request.ValidateClientID(clientID); err != nil {
		return f, false, err
	}
	if err := request.ValidateID(id); err != nil {
		return f, false, err
	}
	var ans queuedAnswer
	if err := q.askDispatchers(ctx, queuedSubject, clientID, id, maxQueuedScan, &ans); err != nil {
		return f, false, fmt.Errorf("asking the dispatchers about %s: %w", id, err)
	}
	if ans.Error != "" {
		return f, false, fmt.Errorf("a dispatcher looking for %s: %s", id, ans.Error)
	}
	return request.Found{Queued: ans.Queued, Seq: ans.Seq, Kept: ans.Kept}, ans.Found, nil
}
