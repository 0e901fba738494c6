package queue

import "github.com/penguinhq/dispatcher/pkg/request"

// Errors the queue returns when it does not take a request: the shared words' (package
// request), so that ingest need not import the queue to read them.
var (
	ErrBacklogFull = request.ErrBacklogFull
	ErrQueueFull   = request.ErrQueueFull
	ErrUnavailable = request.ErrUnavailable
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
