package queue

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// questionSubject is where dispatchers answer operators' questions (pkg/introspect). The
// answer is core NATS request/reply: nothing is stored. The subject keeps the name it had
// when the only question was about lanes, and so do the NATS users' permissions.
const questionSubject = "dispatch.ctl.lanes"

// questionHeader names the question a message asks; without it, it is the earlier single
// lane query.
const questionHeader = "Dispatch-Question"

// ServeQuestions answers operators' questions with what answer returns (JSON) for the
// question's name and body, until stop is called. A question that answer fails is not
// answered: the asker hears from the other dispatchers.
func (q *Queue) ServeQuestions(answer func(ctx context.Context, name string, body []byte) ([]byte, error)) (stop func(), err error) {
	sub, err := q.nc.Subscribe(questionSubject, func(m *nats.Msg) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		out, err := answer(ctx, m.Header.Get(questionHeader), m.Data)
		if err != nil {
			return
		}
		_ = m.Respond(out)
	})
	if err != nil {
		return nil, fmt.Errorf("serving questions: %w", err)
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// Ask sends the question named name, with body, to every dispatcher, and returns the
// answers that arrive within wait, one per dispatcher; as soon as expect answers arrived
// when expect is above 0.
func (q *Queue) Ask(ctx context.Context, name string, body []byte, wait time.Duration, expect int) ([]json.RawMessage, error) {
	inbox := q.nc.NewInbox()
	sub, err := q.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("asking the dispatchers: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	m := nats.NewMsg(questionSubject)
	m.Reply, m.Data = inbox, body
	if name != "" {
		m.Header.Set(questionHeader, name)
	}
	if err := q.nc.PublishMsg(m); err != nil {
		return nil, fmt.Errorf("asking the dispatchers: %w", err)
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
