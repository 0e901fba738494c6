package request

import (
	"errors"
	"fmt"
	"time"
)

// The errors the service's parts hand each other across their seams (the ports of
// pkg/dispatch/ports.go and pkg/ingest), read with errors.Is and errors.As: the queue
// and raven's client return them; ingest and the dispatcher decide by them, and the
// simulation's fakes return the same.

// Errors the queue returns when it does not take a request. Ingest maps them to HTTP
// answers; none of them means anything already queued was touched.
var (
	// ErrBacklogFull: this client's backlog is at its cap. Try again later.
	ErrBacklogFull = errors.New("client backlog is full")
	// ErrQueueFull: the whole queue is at its size limit. Try again later.
	ErrQueueFull = errors.New("queue is full")
	// ErrUnavailable: the queue could not be reached or did not confirm in time.
	ErrUnavailable = errors.New("queue unavailable")
)

// ErrNotQueued is the queue's answer to the removal of a request it does not hold (any
// more): removed before, by an earlier try whose answer was lost, or by someone else.
var ErrNotQueued = errors.New("request not in the queue")

// UndecodableError is a stored message that is not a request ingest wrote (its subject
// holds no valid clientId token). It is dead-lettered, never sent.
type UndecodableError struct{ Err error }

func (e *UndecodableError) Error() string {
	return "subject holds no valid clientId: " + e.Err.Error()
}

// Unwrap returns the decoding error.
func (e *UndecodableError) Unwrap() error { return e.Err }

// PermanentError is raven's answer that retrying will not change (4xx other than 408, 425
// and 429, or a redirect): the request is dead-lettered.
type PermanentError struct {
	Status int // raven's HTTP status
	Err    error
}

func (e *PermanentError) Error() string {
	if e.Err != nil {
		return "permanent failure: " + e.Err.Error()
	}
	return fmt.Sprintf("permanent failure: raven answered %d", e.Status)
}

// Unwrap returns the cause, if any.
func (e *PermanentError) Unwrap() error { return e.Err }

// TransientError is a failure worth retrying: no answer, a timeout, 408, 425, 429 or 5xx.
type TransientError struct {
	Status int           // raven's HTTP status, 0 when raven did not answer
	After  time.Duration // raven's Retry-After, 0 when absent
	Err    error
}

func (e *TransientError) Error() string {
	if e.Err != nil {
		return "transient failure: " + e.Err.Error()
	}
	return fmt.Sprintf("transient failure: raven answered %d", e.Status)
}

// Unwrap returns the cause, if any.
func (e *TransientError) Unwrap() error { return e.Err }

// ErrNoAnswerInTime is raven not answering an attempt in time (what the adaptive budget
// counts as raven overloaded); the error of such an attempt Is it.
var ErrNoAnswerInTime = errors.New("raven did not answer in time")

// RavenStatus is raven's HTTP status that err carries, 0 when none.
func RavenStatus(err error) int {
	var perm *PermanentError
	var tr *TransientError
	switch {
	case errors.As(err, &perm):
		return perm.Status
	case errors.As(err, &tr):
		return tr.Status
	}
	return 0
}
