package queue

import (
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Watching a request's events as they are written (a waiting status read, Prefer: wait).

// WatchEvents calls fn for every event written for request id of client clientID from
// now on, until the returned stop is called. It listens on the client's event subjects
// as they are published (no consumer): an event written while it is not listening is not
// heard, so a caller reads the status after starting the watch.
func (q *Queue) WatchEvents(clientID, id string, fn func(request.Event)) (stop func(), err error) {
	if err := request.ValidateID(id); err != nil {
		return nil, err
	}
	if err := request.ValidateClientID(clientID); err != nil {
		return nil, err
	}
	sub, err := q.nc.Subscribe(request.ClientEventFilter(clientID), func(m *nats.Msg) {
		if e, ok := eventOf(m, id); ok {
			fn(e)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("watching events of %s: %w", id, err)
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// eventOf is the event in m if it is of request id: the id header says whether without
// decoding the others; false for another request's event or a message this service did
// not write.
func eventOf(m *nats.Msg, id string) (request.Event, bool) {
	if m.Header.Get(request.EventIDHeader) != id {
		return request.Event{}, false
	}
	var e request.Event
	if err := json.Unmarshal(m.Data, &e); err != nil || e.ID != id {
		return request.Event{}, false
	}
	return e, true
}
