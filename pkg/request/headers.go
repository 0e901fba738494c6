package request

import "time"

// Header names on a stored request and on what raven receives.
const (
	// HeaderID carries the request id on a stored message.
	HeaderID = "Dispatch-Id"
	// HeaderContentType carries the Content-Type the request arrived with.
	HeaderContentType = "Content-Type"

	// HeaderIdempotencyKey is sent to raven with the request id, and read by ingest.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderClientID is sent to raven, and read by ingest.
	HeaderClientID = "X-Client-Id"
	// HeaderAttempt is sent to raven: 1 for the first attempt, then 2, 3, ...
	HeaderAttempt = "X-Dispatch-Attempt"

	// Dead-letter headers, added to a request when it is moved to the dead-letter stream.
	HeaderDeadReason       = "Dispatch-Dead-Reason"
	HeaderDeadLastStatus   = "Dispatch-Dead-Last-Status"
	HeaderDeadLastError    = "Dispatch-Dead-Last-Error"
	HeaderDeadAttempts     = "Dispatch-Dead-Attempts"
	HeaderDeadFirstAttempt = "Dispatch-Dead-First-Attempt"
	HeaderDeadLastAttempt  = "Dispatch-Dead-Last-Attempt"
	HeaderDeadAcceptedAt   = "Dispatch-Dead-Accepted-At"
	HeaderDeadOrigSeq      = "Dispatch-Dead-Orig-Seq"
	HeaderDeadOrigSubject  = "Dispatch-Dead-Orig-Subject"
)

// Request is one accepted request as the queue stores it.
type Request struct {
	// ID is the request id, unique per request (or per Idempotency-Key).
	ID string
	// ClientID is the raw clientId, already validated.
	ClientID string
	// ContentType is the Content-Type the request arrived with.
	ContentType string
	// Body is the request body, byte for byte.
	Body []byte
}

// Stored is a request read back from the queue.
type Stored struct {
	Request
	// Seq is the request's sequence in the queue's stream.
	Seq uint64
	// Subject is the subject the request is stored under.
	Subject string
	// AcceptedAt is when the queue stored it (the server's clock).
	AcceptedAt time.Time
}

// DeadLetter says why a request was moved to the dead-letter stream.
type DeadLetter struct {
	Reason       string // "permanent", "attempts-exhausted", "age-exhausted", "undecodable" or "purged"
	LastStatus   int    // raven's last HTTP status, 0 when there was none
	LastError    string // the last error, empty when raven answered
	Attempts     int
	FirstAttempt time.Time
	LastAttempt  time.Time
}

// Reasons for dead-lettering.
const (
	ReasonPermanent         = "permanent"
	ReasonAttemptsExhausted = "attempts-exhausted"
	ReasonAgeExhausted      = "age-exhausted"
	ReasonUndecodable       = "undecodable"
	ReasonPurged            = "purged" // an operator purged the client's backlog
)

// Receipt is what the queue says about a request it accepted.
type Receipt struct {
	// Seq is the request's sequence in the queue's stream.
	Seq uint64
	// Duplicate is true when the same id was accepted before, within the duplicate window;
	// Seq is then the first copy's.
	Duplicate bool
}
