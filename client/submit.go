package client

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Receipt is ingest's word that it stored a request.
type Receipt struct {
	// ID names the stored request; give it, with ClientID, to Status and Wait.
	ID string
	// ClientID is the clientId the request is spaced under.
	ClientID string
	// Duplicate is true when a request with the same IdempotencyKey had been stored
	// before and this submit stored nothing new. It is a success: ID names that request.
	Duplicate bool
	// NotBefore is the earliest time the request will be sent to raven, zero when it
	// may go at once, and on a Duplicate (the stored request keeps the Not-Before it was
	// first sent with: its Status says it).
	NotBefore time.Time
	// IdempotencyKey is the key the request was sent with: the caller's, or the one the
	// client generated. Submitting again with it stores nothing twice.
	IdempotencyKey string
}

// SubmitOption changes one Submit.
type SubmitOption func(*submitSettings)

type submitSettings struct {
	idempotencyKey string
	notBefore      string // the Not-Before header, empty for none
	notAfter       string // the Not-After header, empty for none
}

// WithIdempotencyKey sends key (1 to 256 printable ASCII characters) as the
// Idempotency-Key: ingest stores one request per key, however often it is submitted.
// Without it (or with an empty key) Submit generates a random key, used for all the
// retries of that one Submit.
func WithIdempotencyKey(key string) SubmitOption {
	return func(s *submitSettings) { s.idempotencyKey = key }
}

// WithNotBefore asks ingest not to send the request to raven before t. It is sent in
// UTC as RFC 3339 with nanoseconds. A zero t takes back an earlier WithNotBefore or
// WithDelay.
func WithNotBefore(t time.Time) SubmitOption {
	return func(s *submitSettings) { s.notBefore = timeText(t) }
}

// WithNotAfter gives the request a deadline: not attempted by t, it is never sent to
// raven but dead-lettered with the reason "expired" (Status.DeadLetter.Reason); an
// attempt under way at t is not cut short. It is sent in UTC as RFC 3339 with
// nanoseconds, and must lie ahead and after the request's Not-Before, else ingest
// refuses the request (a *Problem, code not_after_invalid). A zero t takes back an
// earlier WithNotAfter.
func WithNotAfter(t time.Time) SubmitOption {
	return func(s *submitSettings) { s.notAfter = timeText(t) }
}

// timeText is t as ingest reads a time, in UTC as RFC 3339 with nanoseconds; empty for
// the zero time.
func timeText(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// WithDelay asks ingest not to send the request to raven sooner than d after it
// accepts it. It is sent in whole seconds, rounded up; a d of zero or less asks for no
// delay. The delay counts from the try that ingest accepts, not from the first try.
func WithDelay(d time.Duration) SubmitOption {
	return func(s *submitSettings) {
		s.notBefore = ""
		if d > 0 {
			s.notBefore = strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
		}
	}
}

// receiptAnswer is the JSON of a 202 to POST /v1/requests, and of a queued batch
// result.
type receiptAnswer struct {
	ID        string    `json:"id"`
	ClientID  string    `json:"clientId"`
	Duplicate bool      `json:"duplicate"`
	NotBefore time.Time `json:"notBefore"`
}

func (a receiptAnswer) receipt(idempotencyKey string) Receipt {
	return Receipt{ID: a.ID, ClientID: a.ClientID, Duplicate: a.Duplicate, NotBefore: a.NotBefore, IdempotencyKey: idempotencyKey}
}

// Submit stores one request for clientID with ingest; body is the JSON that raven
// will receive, byte for byte. It retries as the package doc says, always with the
// same Idempotency-Key, so the request is stored once. On an error the Receipt still
// carries that key, to submit again later without storing twice.
func (c *Client) Submit(ctx context.Context, clientID string, body []byte, opts ...SubmitOption) (Receipt, error) {
	var s submitSettings
	for _, opt := range opts {
		opt(&s)
	}
	if s.idempotencyKey == "" {
		s.idempotencyKey = newIdempotencyKey()
	}
	if clientID == "" {
		return Receipt{IdempotencyKey: s.idempotencyKey}, fmt.Errorf("client: submitting: %w", ErrClientIDMissing)
	}
	if err := checkBody(body); err != nil {
		return Receipt{IdempotencyKey: s.idempotencyKey}, fmt.Errorf("client: submitting for %s: %w", clientID, err)
	}
	header := http.Header{}
	header.Set("Content-Type", "application/json")
	header.Set("X-Client-Id", clientID)
	header.Set("Idempotency-Key", s.idempotencyKey)
	if s.notBefore != "" {
		header.Set("Not-Before", s.notBefore)
	}
	if s.notAfter != "" {
		header.Set("Not-After", s.notAfter)
	}
	var answer receiptAnswer
	op := "client: submitting for " + clientID
	if err := c.call(ctx, op, http.MethodPost, "/v1/requests", header, body, &answer); err != nil {
		return Receipt{ClientID: clientID, IdempotencyKey: s.idempotencyKey}, err
	}
	return answer.receipt(s.idempotencyKey), nil
}

// checkBody says what is wrong with a body ingest would refuse: none, or not JSON.
func checkBody(body []byte) error {
	switch {
	case len(body) == 0:
		return fmt.Errorf("%w: it is empty; give the JSON raven is to receive, such as {}", ErrBodyNotJSON)
	case !json.Valid(body):
		return ErrBodyNotJSON
	}
	return nil
}

// newIdempotencyKey is a random key of 26 base32 characters (at least 128 bits), well
// inside ingest's 1 to 256 printable ASCII.
func newIdempotencyKey() string {
	return rand.Text()
}
