package client

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// State is where a request is on its way to raven.
type State string

// The states ingest reports. Only StatusDelivered, StatusDeadLettered and
// StatusCancelled are final.
const (
	// StatusQueued is stored and waiting for its turn.
	StatusQueued State = "queued"
	// StatusInFlight is being sent to raven now.
	StatusInFlight State = "in_flight"
	// StatusDelivered was accepted by raven.
	StatusDelivered State = "delivered"
	// StatusDeadLettered was given up on; see Status.DeadLetter.
	StatusDeadLettered State = "dead_lettered"
	// StatusCancelled was cancelled (Client.Cancel) while queued: it left the queue
	// unsent, and raven never receives it.
	StatusCancelled State = "cancelled"
	// StatusUnknown is an id ingest does not know: never accepted, older than the
	// retention, or accepted a few milliseconds ago and not yet written. It is not
	// final.
	StatusUnknown State = "unknown"
)

// Status is what ingest knows of one request. Optional parts are zero (or nil) when
// ingest did not send them.
type Status struct {
	// ID names the request.
	ID string `json:"id"`
	// ClientID is the clientId the request is spaced under.
	ClientID string `json:"clientId,omitempty"`
	// State is where the request is.
	State State `json:"status"`
	// AcceptedAt is when ingest stored the request.
	AcceptedAt time.Time `json:"acceptedAt,omitzero"`
	// NotBefore is the earliest time the request goes to raven.
	NotBefore time.Time `json:"notBefore,omitzero"`
	// NotAfter is when the request stops being sent: not attempted by then, it is
	// dead-lettered with the reason "expired".
	NotAfter time.Time `json:"notAfter,omitzero"`
	// Attempts is how many times the request was sent to raven.
	Attempts int `json:"attempts"`
	// LastAttempt is the latest of those times.
	LastAttempt *Attempt `json:"lastAttempt,omitempty"`
	// DeliveredAt is when raven accepted the request.
	DeliveredAt time.Time `json:"deliveredAt,omitzero"`
	// CancelledAt is when a cancel removed the request from its client's queue.
	CancelledAt time.Time `json:"cancelledAt,omitzero"`
	// RavenStatus is the HTTP status raven accepted the request with.
	RavenStatus int `json:"ravenStatus,omitempty"`
	// Response is raven's answer to the latest attempt it answered: the delivery's, the
	// one that dead-lettered the request, or while it is retried the last failed one's.
	// Nil before raven answered.
	Response *Response `json:"response,omitempty"`
	// DeadLetter says why the request was given up on.
	DeadLetter *DeadLetter `json:"deadLetter,omitempty"`
	// Replays is how many times the request was replayed from the dead letters.
	Replays int `json:"replays"`
	// Queue is where the request stands in its client's queue.
	Queue *QueuePosition `json:"queue,omitempty"`
	// UpdatedAt is when this status last changed.
	UpdatedAt time.Time `json:"updatedAt,omitzero"`
}

// Final reports whether the status will not change by itself: delivered,
// dead-lettered or cancelled. (A dead-lettered request may still be replayed by an
// operator.)
func (s Status) Final() bool {
	return s.State == StatusDelivered || s.State == StatusDeadLettered || s.State == StatusCancelled
}

// Response is raven's answer as the dispatcher keeps it: its status, the headers the
// operators chose (RESPONSE_HEADERS, Content-Type by default) and its body up to
// RESPONSE_MAX_BYTES (64 KiB by default).
type Response struct {
	// Status is raven's HTTP status.
	Status int `json:"status"`
	// Headers are the kept headers, by canonical name.
	Headers map[string]string `json:"headers,omitempty"`
	// Text is the kept body as sent when it is UTF-8; base64 when Encoding says so. Body
	// decodes either.
	Text string `json:"body,omitempty"`
	// Encoding is "base64" when Text holds a body that was not UTF-8.
	Encoding string `json:"bodyEncoding,omitempty"`
	// BodyBytes is how many bytes of raven's body were kept.
	BodyBytes int `json:"bodyBytes,omitempty"`
	// Truncated says raven's body was longer than what was kept.
	Truncated bool `json:"truncated,omitempty"`
}

// Body is the kept body as raven sent it. On a nil Response (Status.Response of a
// request raven never answered: not attempted yet, expired unsent, cancelled, purged)
// it is nil, with no error.
func (r *Response) Body() ([]byte, error) {
	if r == nil {
		return nil, nil
	}
	if r.Encoding != "base64" {
		return []byte(r.Text), nil
	}
	b, err := base64.StdEncoding.DecodeString(r.Text)
	if err != nil {
		return nil, fmt.Errorf("client: the kept body is not base64: %w", err)
	}
	return b, nil
}

// Attempt is one try at sending a request to raven.
type Attempt struct {
	// At is when the try was made.
	At time.Time `json:"at"`
	// Status is raven's HTTP status, zero when raven did not answer.
	Status int `json:"status,omitempty"`
	// Error says what went wrong, empty when nothing did.
	Error string `json:"error,omitempty"`
}

// DeadLetter says why a request was given up on.
type DeadLetter struct {
	// Reason names why, such as "permanent".
	Reason string `json:"reason"`
	// At is when it was given up on.
	At time.Time `json:"at"`
	// LastStatus is raven's last HTTP status, zero when raven did not answer.
	LastStatus int `json:"lastStatus,omitempty"`
	// LastError is the last try's error.
	LastError string `json:"lastError,omitempty"`
	// Replayable is true when an operator can send the request again.
	Replayable bool `json:"replayable"`
}

// QueuePosition is where a request stands in its client's queue.
type QueuePosition struct {
	// Backlog is how many requests of the client are waiting.
	Backlog int `json:"backlog"`
	// AtHead is true when the request is next.
	AtHead bool `json:"atHead"`
}

// Status asks ingest once (no long poll) where request id of client clientID is (a
// Receipt's ID and ClientID), retrying as every call does. Statuses are kept by client,
// so the question names both.
func (c *Client) Status(ctx context.Context, clientID, id string) (Status, error) {
	return c.status(ctx, clientID, id, 0)
}

// status asks where request id is; a wait above zero asks ingest to hold the answer
// up to that long, until the status is final.
func (c *Client) status(ctx context.Context, clientID, id string, wait time.Duration) (Status, error) {
	if id == "" {
		return Status{}, fmt.Errorf("client: asking a status: %w", ErrIDMissing)
	}
	if clientID == "" {
		return Status{}, fmt.Errorf("client: asking the status of %s: %w", id, ErrClientIDMissing)
	}
	q := url.Values{"clientId": {clientID}}
	if wait > 0 {
		q.Set("wait", wait.String())
	}
	path := "/v1/requests/" + url.PathEscape(id) + "?" + q.Encode()
	var s Status
	if err := c.call(ctx, "client: asking the status of "+id, http.MethodGet, path, nil, nil, &s); err != nil {
		return Status{}, err
	}
	return s, nil
}

// Wait asks ingest where request id of client clientID is until the status is final
// (delivered, dead-lettered or cancelled) or ctx ends, and returns the last status it
// heard of, with ctx's error (wrapped) when ctx ended first. A status ingest cannot read
// just now (503 status_unavailable) is asked again, as every call retries.
//
// An unknown status ends Wait at once with ErrNoSuchRequest (wrapped): ingest holds no
// request id for clientID (a clientId not the Receipt's, as clientIds are
// case-sensitive; an id not the Receipt's), or it is older than the status retention.
//
// Each question is a long poll, GET /v1/requests/{id}?clientId=C&wait=D, where D is MaxWaitPoll,
// or less when ctx ends sooner (D leaves a tenth of the time left, at most a second,
// for the answer to arrive) or the http.Client's Timeout is short (D is at most half
// of it). Each poll retries as every call does. Should ingest answer a poll with a
// status that is not final before half of D has passed, Wait backs off as
// RetryPolicy says before asking again, so an ingest that does not hold answers is
// not asked in a tight loop.
func (c *Client) Wait(ctx context.Context, clientID, id string) (Status, error) {
	var last Status
	early := retrier{policy: RetryPolicy{Base: c.retry.Base, Max: c.retry.Max}}
	for {
		poll := c.pollDuration(ctx)
		start := time.Now()
		s, err := c.status(ctx, clientID, id, poll)
		if err != nil {
			return last, err
		}
		last = s
		if s.Final() {
			return s, nil
		}
		if s.State == StatusUnknown {
			return s, fmt.Errorf("client: waiting for %s: %w for clientId %q: check the clientId and the id against the Receipt's "+
				"(clientIds are case-sensitive), or the request is older than the status retention", id, ErrNoSuchRequest, clientID)
		}
		if err := ctx.Err(); err != nil {
			return last, fmt.Errorf("client: waiting for %s: %w", id, err)
		}
		if time.Since(start) >= poll/2 && poll > 0 {
			early = retrier{policy: early.policy}
			continue
		}
		if err := early.backOff(ctx, 0); err != nil {
			return last, fmt.Errorf("client: waiting for %s: %w", id, err)
		}
	}
}

// pollDuration is how long the next long poll of Wait asks ingest to hold its
// answer; zero asks for no hold.
func (c *Client) pollDuration(ctx context.Context) time.Duration {
	poll := MaxWaitPoll
	if t := c.http.Timeout; t > 0 {
		poll = min(poll, t/2)
	}
	if deadline, ok := ctx.Deadline(); ok {
		left := time.Until(deadline)
		poll = min(poll, left-min(left/10, time.Second))
	}
	poll = poll.Truncate(time.Millisecond)
	if poll < time.Millisecond {
		return 0
	}
	return poll
}

// Cancel asks ingest to cancel request id of client clientID while it is queued and not
// in flight: it leaves its client's queue unsent, and raven never receives it. The
// status returned is StatusCancelled (again for a request cancelled already: a retried
// Cancel reads the same). A request that can no longer be cancelled comes back as a
// *Problem: 409 "in_flight" while an attempt is under way (raven may receive it), 409
// "not_cancellable" once it ended otherwise, 404 "not_found" for one ingest does not
// know. A 503 (no dispatcher owns the client just now) is retried as every call is.
func (c *Client) Cancel(ctx context.Context, clientID, id string) (Status, error) {
	if id == "" {
		return Status{}, fmt.Errorf("client: cancelling: %w", ErrIDMissing)
	}
	if clientID == "" {
		return Status{}, fmt.Errorf("client: cancelling %s: %w", id, ErrClientIDMissing)
	}
	path := "/v1/requests/" + url.PathEscape(id) + "?" + url.Values{"clientId": {clientID}}.Encode()
	var s Status
	if err := c.call(ctx, "client: cancelling "+id, http.MethodDelete, path, nil, nil, &s); err != nil {
		return Status{}, err
	}
	return s, nil
}
