package queue

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/penguinhq/dispatcher/pkg/jsonkeys"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// laneQuerySubject is where dispatchers answer operators' questions about their lanes.
// The answer is core NATS request/reply: nothing is stored.
const laneQuerySubject = "dispatch.ctl.lanes"

// ServeLaneQueries answers lane queries with what answer returns (JSON), until stop is
// called.
func (q *Queue) ServeLaneQueries(answer func(ctx context.Context, lq request.LaneQuery) (any, error)) (stop func(), err error) {
	sub, err := q.nc.Subscribe(laneQuerySubject, func(m *nats.Msg) {
		var lq request.LaneQuery
		if err := jsonkeys.Unmarshal(m.Data, &lq); err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		out, err := answer(ctx, lq)
		if err != nil {
			return
		}
		b, err := jsonkeys.Marshal(out)
		if err != nil {
			return
		}
		_ = m.Respond(b)
	})
	if err != nil {
		return nil, fmt.Errorf("serving lane queries: %w", err)
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// QueryLanes sends lq to every dispatcher and returns the answers that arrive within
// wait, one per dispatcher.
func (q *Queue) QueryLanes(ctx context.Context, lq request.LaneQuery, wait time.Duration) ([]json.RawMessage, error) {
	return q.QueryLanesUntil(ctx, lq, wait, 0)
}

// QueryLanesUntil is QueryLanes that returns as soon as expect answers arrived (expect
// 0: waits the whole wait).
func (q *Queue) QueryLanesUntil(ctx context.Context, lq request.LaneQuery, wait time.Duration, expect int) ([]json.RawMessage, error) {
	b, err := jsonkeys.Marshal(lq)
	if err != nil {
		return nil, err
	}
	inbox := q.nc.NewInbox()
	sub, err := q.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("querying lanes: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := q.nc.PublishRequest(laneQuerySubject, inbox, b); err != nil {
		return nil, fmt.Errorf("querying lanes: %w", err)
	}
	deadline := time.Now().Add(wait)
	var out []json.RawMessage
	for {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			return out, nil
		}
		m, err := sub.NextMsg(left)
		if err != nil {
			return out, nil // the wait is over
		}
		out = append(out, m.Data)
		if expect > 0 && len(out) >= expect {
			return out, nil
		}
	}
}
