package client

import (
	"context"
	"errors"
	"fmt"
)

// Do sends body for clientID through the dispatcher and returns raven's answer: penguin's
// call to raven, durable and spaced. It submits once (one Idempotency-Key across all its
// retries: the request is stored once, whatever fails on the way), then waits (Wait's
// long polls, which ride out reconnects and ingest restarts) until the request is final,
// or ctx ends.
//
// The returned Status is final: delivered (Status.Response is raven's 2xx answer) or
// dead-lettered (Status.DeadLetter says why; Status.Response is raven's answer to the
// last attempt, when it answered). Either way the error is nil: raven's answer is the
// result. An error means one of:
//
//   - the call itself is wrong and nothing was sent: ErrClientIDMissing, or
//     ErrBodyNotJSON (a nil or empty body among them);
//   - Submit failed: a *NotSubmittedError, wrapping a *Problem such as a 400 or ctx
//     ending while it retried, when the request may have been stored all the same. Its
//     Receipt holds the Idempotency-Key the request was sent with: Do again with
//     WithIdempotencyKey and that key, and it is stored at most once;
//   - ctx ended before the request was final (Status is then the last one read; the
//     request is queued and will still be sent).
//
// Raven's body is kept up to the dispatcher's RESPONSE_MAX_BYTES (64 KiB by default):
// Response.Truncated says when it was longer.
func (c *Client) Do(ctx context.Context, clientID string, body []byte, opts ...SubmitOption) (Status, error) {
	r, err := c.Submit(ctx, clientID, body, opts...)
	switch {
	case errors.Is(err, ErrClientIDMissing) || errors.Is(err, ErrBodyNotJSON):
		return Status{}, err // never sent: there is nothing to send again
	case err != nil:
		return Status{}, &NotSubmittedError{Receipt: r, Err: err}
	}
	st, err := c.Wait(ctx, r.ClientID, r.ID)
	switch {
	case errors.Is(err, ErrNoSuchRequest):
		return st, fmt.Errorf("client: %s was stored, but ingest no longer finds it: %w", r.ID, err)
	case err != nil:
		return st, fmt.Errorf("client: %s is stored and will be sent, but was not final in time: %w", r.ID, err)
	}
	return st, nil
}

// NotSubmittedError is Do's error when its Submit failed. The request may have been
// stored all the same (an answer lost on the way, ctx ending while Submit retried):
// Receipt.IdempotencyKey is the key it was sent with, the caller's or the one Do made, so
// that Do again with WithIdempotencyKey(Receipt.IdempotencyKey) stores it at most once.
// errors.As and errors.Is see through it to Submit's error (a *Problem, the context's
// error). A call that sent nothing (an empty clientId, a body that is not JSON) gets
// that error itself, not a NotSubmittedError.
type NotSubmittedError struct {
	Receipt Receipt
	Err     error
}

func (e *NotSubmittedError) Error() string {
	return e.Err.Error() + " (sent with Idempotency-Key " + e.Receipt.IdempotencyKey + ": send again with it to store the request once)"
}

func (e *NotSubmittedError) Unwrap() error { return e.Err }
