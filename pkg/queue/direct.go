package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// DirectBatch sends one batched direct get (req, JSON: multi_last, next_by_subj,
// start_time, batch...) to stream and gathers the messages it answers until the batch's
// end (204) or nothing found (404), at most max of them. The answers land in a channel of
// that size: a SubscribeSync would allocate nats.go's default of 65,536 slots, 512 KiB
// for every read, and concurrent status reads would take an ingest's memory (issue 35).
// No answer by ctx's end, or no responders, is request.ErrUnavailable.
func DirectBatch(ctx context.Context, nc *nats.Conn, stream string, req any, max int) ([]*nats.Msg, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	inbox := nc.NewRespInbox()
	msgs := make(chan *nats.Msg, max+4) // the batch and its end marker
	sub, err := nc.ChanSubscribe(inbox, msgs)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest("$JS.API.DIRECT.GET."+stream, inbox, body); err != nil {
		return nil, err
	}
	var out []*nats.Msg
	for {
		var m *nats.Msg
		select {
		case m = <-msgs:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w", request.ErrUnavailable, ctx.Err())
		}
		switch status := m.Header.Get("Status"); status {
		case "":
			out = append(out, m)
		case "204", "404": // the batch's end; nothing found
			return out, nil
		case "503":
			return nil, fmt.Errorf("%w: no responders (is stream %s there?)", request.ErrUnavailable, stream)
		default:
			return nil, fmt.Errorf("status %s %s", status, m.Header.Get("Description"))
		}
	}
}

// DirectGet sends one direct get of a single message (req, JSON, without a batch) to
// stream: the message, or nil when there is none. Unlike a batched get, the server does
// not count what is pending after it. No answer by ctx's end, or no responders, is
// request.ErrUnavailable.
func DirectGet(ctx context.Context, nc *nats.Conn, stream string, req any) (*nats.Msg, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	m, err := nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+stream, body)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return nil, fmt.Errorf("%w: no responders (is stream %s there?)", request.ErrUnavailable, stream)
	case err != nil:
		return nil, fmt.Errorf("%w: %w", request.ErrUnavailable, err)
	}
	switch status := m.Header.Get("Status"); status {
	case "":
		return m, nil
	case "404":
		return nil, nil
	default:
		return nil, fmt.Errorf("status %s %s", status, m.Header.Get("Description"))
	}
}
