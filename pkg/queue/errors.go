package queue

import (
	"errors"

	"github.com/penguinhq/dispatcher/pkg/request"
)

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

// UndecodableError is what Head returns with a message whose subject holds no valid
// clientId token: it was not written by ingest. It is to be dead-lettered, never sent.
// It is the shared words' (package request), which the dispatcher reads.
type UndecodableError = request.UndecodableError

// Dead-letter headers, added to a request when it is moved to the dead-letter stream.
const (
	headerDeadReason       = "Dispatch-Dead-Reason"
	headerDeadLastStatus   = "Dispatch-Dead-Last-Status"
	headerDeadLastError    = "Dispatch-Dead-Last-Error"
	headerDeadAttempts     = "Dispatch-Dead-Attempts"
	headerDeadFirstAttempt = "Dispatch-Dead-First-Attempt"
	headerDeadLastAttempt  = "Dispatch-Dead-Last-Attempt"
	headerDeadAcceptedAt   = "Dispatch-Dead-Accepted-At"
	headerDeadOrigSeq      = "Dispatch-Dead-Orig-Seq"
	headerDeadOrigSubject  = "Dispatch-Dead-Orig-Subject"
)
