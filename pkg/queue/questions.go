package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// questionSubject is where dispatchers answer operators' questions (pkg/introspect). The
// answer is core NATS request/reply: nothing is stored. The subject keeps the name it had
// when the only question was about lanes, and so do the NATS users' permissions.
const questionSubject = "dispatch.ctl.lanes"

// questionHeader names the question a message asks.
const questionHeader = "Dispatch-Question"

// answerErrorHeader says why a dispatcher could not answer a question, on a reply with
// no body; answerInstanceHeader names the dispatcher.
const (
	answerErrorHeader    = "Dispatch-Answer-Error"
	answerInstanceHeader = "Dispatch-Instance"
	// answerWithinHeader is how long the asker waits (a Go duration): a dispatcher that
	// cannot answer by then says so while the asker still listens.
	answerWithinHeader = "Dispatch-Answer-Within"
)

// answerTime is how long a dispatcher takes at most over an answer: a second, or half the
// asker's wait when that is shorter (the other half for its word to arrive).
func answerTime(within string) time.Duration {
	wait, err := time.ParseDuration(within)
	if err != nil || wait <= 0 {
		return time.Second
	}
	return min(time.Second, wait/2)
}

// Unanswered is a dispatcher's word that it could not answer a question, and why: the
// asker shows it, where it would otherwise have waited out its wait for nothing and shown
// that dispatcher's part as empty.
type Unanswered struct {
	Instance string
	Reason   string
}

// ServeQuestions answers operators' questions, as instance, with what answer returns
// (JSON) for the question's name and body, until stop is called. A question that answer
// fails, or whose answer is larger than the server carries (its max_payload), is
// answered with why (an Unanswered at the asker), and log hears of it, at most once a
// minute.
func (q *Queue) ServeQuestions(instance string, answer func(ctx context.Context, name string, body []byte) ([]byte, error), log zerolog.Logger) (stop func(), err error) {
	var warned atomic.Int64 // unix nanoseconds of the last warning
	sub, err := q.nc.Subscribe(questionSubject, func(m *nats.Msg) {
		ctx, cancel := context.WithTimeout(context.Background(), answerTime(m.Header.Get(answerWithinHeader)))
		defer cancel()
		name := m.Header.Get(questionHeader)
		out, err := answer(ctx, name, m.Data)
		if err == nil {
			if err = m.Respond(out); errors.Is(err, nats.ErrMaxPayload) {
				err = fmt.Errorf("its answer of %d bytes is over the NATS server's max_payload of %d bytes", len(out), q.nc.MaxPayload())
			}
		}
		if err == nil || m.Reply == "" {
			return
		}
		if last := warned.Load(); time.Since(time.Unix(0, last)) >= time.Minute && warned.CompareAndSwap(last, time.Now().UnixNano()) {
			log.Warn().Err(err).Str("question", name).Msg("could not answer an operators' question; the asker is told why")
		}
		r := nats.NewMsg(m.Reply)
		why := strings.Join(strings.Fields(err.Error()), " ") // one line, as a header is
		if len(why) > 512 {
			why = strings.ToValidUTF8(why[:512], "")
		}
		r.Header.Set(answerErrorHeader, why)
		r.Header.Set(answerInstanceHeader, instance)
		_ = q.nc.PublishMsg(r)
	})
	if err != nil {
		return nil, fmt.Errorf("serving questions: %w", err)
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// Ask sends the question named name, with body, to every dispatcher, and returns the
// answers that arrive within wait, one per dispatcher, and the word of those that could
// not answer; as soon as expect dispatchers have replied when expect is above 0.
func (q *Queue) Ask(ctx context.Context, name string, body []byte, wait time.Duration, expect int) ([]json.RawMessage, []Unanswered, error) {
	inbox := q.nc.NewInbox()
	sub, err := q.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, nil, fmt.Errorf("asking the dispatchers: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	m := nats.NewMsg(questionSubject)
	m.Reply, m.Data = inbox, body
	m.Header.Set(questionHeader, name)
	m.Header.Set(answerWithinHeader, wait.String())
	if err := q.nc.PublishMsg(m); err != nil {
		return nil, nil, fmt.Errorf("asking the dispatchers: %w", err)
	}
	deadline := time.Now().Add(wait)
	var out []json.RawMessage
	var unanswered []Unanswered
	for {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			return out, unanswered, nil
		}
		m, err := sub.NextMsg(left)
		if err != nil {
			return out, unanswered, nil // the wait is over
		}
		if why := m.Header.Get(answerErrorHeader); why != "" {
			unanswered = append(unanswered, Unanswered{Instance: m.Header.Get(answerInstanceHeader), Reason: why})
		} else {
			out = append(out, m.Data)
		}
		if expect > 0 && len(out)+len(unanswered) >= expect {
			return out, unanswered, nil
		}
	}
}
