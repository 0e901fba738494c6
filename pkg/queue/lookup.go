package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// lookupSkew is how far apart the time in a request's id (ingest's clock, when it
// accepted it) and the time the server stored it (the server's clock) may be for the
// direct lookup to find it: the lookup reads the client's requests stored from this long
// before the id's time to this long after. Past it (clocks further apart than this), a
// request is still found, by the scan lookupQueued falls back to.
const lookupSkew = 2 * time.Second

// maxLookupReads bounds the messages a lookup reads one by one, in the client's queue
// around the id's time and in its kept final events: past it, the scan answers.
const maxLookupReads = 256

// lookupQueued finds request id of clientID in the queue, for a status read that found
// no record of it. An id ingest made carries its time (request.IDTime), so the request is
// found by reading the client's subject from that time on, one message at a time, from
// the stream's leader (the server finds a time by binary search and a subject by its
// index; the leader answers whatever the replicas, and is never behind): a few messages
// read, whatever the queue holds. Only when that does not find it (a keyed id, which
// carries no time; clocks further apart than lookupSkew; more than maxLookupReads of the
// client's requests around that time; a request not queued) is the client's queue
// scanned, headers only, to say so for certain.
func (q *Queue) lookupQueued(ctx context.Context, id, clientID string) (request.Stored, bool, error) {
	if err := request.ValidateClientID(clientID); err != nil {
		return request.Stored{}, false, err
	}
	if at, ok := request.IDTime(id); ok {
		s, found, err := q.lookupNear(ctx, id, clientID, at)
		if found || ctx.Err() != nil {
			return s, found, err
		}
	}
	f, ok, err := q.FindRequest(ctx, id, clientID)
	return f.Stored, ok, err
}

// lookupNear reads clientID's requests stored within lookupSkew of at, looking for id.
func (q *Queue) lookupNear(ctx context.Context, id, clientID string, at time.Time) (request.Stored, bool, error) {
	until := at.Add(lookupSkew)
	var found request.Stored
	ok, err := q.walk(ctx, q.StoredSubject(clientID), at.Add(-lookupSkew), func(m *leaderMsg) (bool, bool) {
		if m.Time.After(until) {
			return false, true
		}
		if m.Header.Get(request.HeaderID) != id {
			return false, false
		}
		found = storedOf(m.Subject, m.Header, nil, m.Seq, m.Time)
		return true, true
	})
	return found, ok, err
}

// keptOutcomes are the final events of request id kept in the request stream (ADR 9:
// the events stream did not take them before the request was removed) and not yet
// written to the events stream: what became of a request that left the queue while its
// record cannot say so yet. Read from the client's outcome subject, from the id's time
// on when it has one (a final event is kept after its request was accepted).
func (q *Queue) keptOutcomes(ctx context.Context, id, clientID string) ([]request.Event, error) {
	var from time.Time
	if at, ok := request.IDTime(id); ok {
		from = at.Add(-lookupSkew)
	}
	var kept []request.Event
	_, err := q.walk(ctx, request.OutcomeSubject(clientID), from, func(m *leaderMsg) (bool, bool) {
		var e request.Event
		if json.Unmarshal(m.Data, &e) == nil && e.ID == id && e.ClientID == clientID && e.Final() {
			kept = append(kept, e)
		}
		return false, false
	})
	return kept, err
}

// walk reads the messages on subject stored from from on (from the first when zero), one
// at a time from the stream's leader, until take says done (ok: what it was looking
// for), the subject has no more, or maxLookupReads were read (an error: not known).
func (q *Queue) walk(ctx context.Context, subject string, from time.Time, take func(*leaderMsg) (ok, done bool)) (bool, error) {
	req := msgGet{NextFor: subject, Seq: 1}
	if !from.IsZero() {
		req.StartTime, req.Seq = &from, 0
	}
	for range maxLookupReads {
		m, err := q.leaderGet(ctx, req)
		if err != nil || m == nil {
			return false, err
		}
		if ok, done := take(m); done {
			return ok, nil
		}
		req.StartTime, req.Seq = nil, m.Seq+1
	}
	return false, fmt.Errorf("more than %d messages on %s around the request's time", maxLookupReads, subject)
}

// msgGet is the JetStream API's message get: the first message on NextFor at or after
// Seq, or stored at or after StartTime.
type msgGet struct {
	Seq       uint64     `json:"seq,omitempty"`
	NextFor   string     `json:"next_by_subj"`
	StartTime *time.Time `json:"start_time,omitempty"`
}

// leaderMsg is a message as the stream's leader answers a message get.
type leaderMsg struct {
	Subject string      `json:"subject"`
	Seq     uint64      `json:"seq"`
	Headers []byte      `json:"hdrs"`
	Data    []byte      `json:"data"`
	Time    time.Time   `json:"time"`
	Header  nats.Header `json:"-"`
}

// parseHeaders reads a NATS header block ("NATS/1.0", then "Key: value" lines), keys as
// written (NATS headers are case-sensitive).
func parseHeaders(b []byte) nats.Header {
	h := nats.Header{}
	lines := strings.Split(string(b), "\r\n")
	for _, line := range lines[min(1, len(lines)):] {
		if k, v, ok := strings.Cut(line, ":"); ok && k != "" {
			h[k] = append(h[k], strings.TrimSpace(v))
		}
	}
	return h
}

// leaderGet asks the stream's leader for one message of the request stream: nil when
// there is none. Unlike a direct get it works whatever the stream's replicas (a
// replicated stream takes no direct gets, queue.go) and is never behind.
func (q *Queue) leaderGet(ctx context.Context, req msgGet) (*leaderMsg, error) {
	body, _ := json.Marshal(req)
	reply, err := q.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+RequestStream, body)
	if err != nil {
		return nil, fmt.Errorf("%w: reading stream %s: %w", request.ErrUnavailable, RequestStream, err)
	}
	var ans struct {
		Message *leaderMsg `json:"message"`
		Error   *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(reply.Data, &ans); err != nil {
		return nil, fmt.Errorf("reading stream %s: %w", RequestStream, err)
	}
	switch {
	case ans.Error != nil && ans.Error.Code == 404:
		return nil, nil
	case ans.Error != nil:
		return nil, fmt.Errorf("reading stream %s: %d %s", RequestStream, ans.Error.Code, ans.Error.Description)
	case ans.Message == nil:
		return nil, errors.New("reading stream " + RequestStream + ": an answer without a message")
	}
	m := ans.Message
	m.Header = parseHeaders(m.Headers)
	return m, nil
}
