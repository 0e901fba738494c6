package queue

import "errors"

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
type UndecodableError struct{ Err error }

func (e *UndecodableError) Error() string {
	return "subject holds no valid clientId: " + e.Err.Error()
}

// Unwrap returns the decoding error.
func (e *UndecodableError) Unwrap() error { return e.Err }

// Undecodable marks the error for the dispatcher, which knows it by this method.
func (e *UndecodableError) Undecodable() bool { return true }

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
