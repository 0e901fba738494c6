package request

import (
	"fmt"
	"strings"
	"time"
)

// Header names on a stored request and on what raven receives.
const (
	// HeaderID carries the request id on a stored message.
	HeaderID = "Dispatch-Id"
	// HeaderContentType carries the Content-Type the request arrived with.
	HeaderContentType = "Content-Type"
	// HeaderNotBefore carries, on a stored message, the earliest time (RFC 3339) the
	// request may be attempted.
	HeaderNotBefore = "Dispatch-Not-Before"
	// HeaderNotAfter carries, on a stored message, the time (RFC 3339) after which the
	// request is not sent: dead-lettered as expired instead.
	HeaderNotAfter = "Dispatch-Not-After"
	// HeaderCycle carries, on a stored message, how many times the request was replayed.
	HeaderCycle = "Dispatch-Cycle"
	// HeaderBodyDigest carries, on a stored request sent with an Idempotency-Key, its
	// body's digest (BodyDigestOf): the key sent again with another body is refused, not
	// taken for the same request, before its accepted event (which has the digest too)
	// is written.
	HeaderBodyDigest = "Dispatch-Body-Digest"

	// HeaderIdempotencyKey is sent to raven with the request id, and read by ingest.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderClientID is sent to raven, and read by ingest.
	HeaderClientID = "X-Client-Id"
	// HeaderAttempt is sent to raven: 1 for the first attempt, then 2, 3, ...
	HeaderAttempt = "X-Dispatch-Attempt"
	// HeaderTraceParent and HeaderTraceState hold a stored request's W3C trace context,
	// named as the W3C names them.
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
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
	// NotBefore is the earliest the request may be attempted; zero: at once.
	NotBefore time.Time
	// NotAfter is when the request stops being worth sending: an attempt not started by
	// then is never made, and the request is dead-lettered as expired. Zero: never.
	NotAfter time.Time
	// Cycle is how many times the request was replayed from the dead-letter stream.
	Cycle int
	// TraceParent and TraceState are the W3C trace context the request was accepted (or
	// last replayed) in, when tracing is on: its attempts are spans of that trace.
	TraceParent, TraceState string
	// BodyDigest is BodyDigestOf(ID, Body): set by ingest for a request sent with an
	// Idempotency-Key, "" for others.
	BodyDigest string
}

// Stored is a request read back from the queue.
type Stored struct {
	Request
	// Seq is the request's sequence in the queue's stream.
	Seq uint64
	// Subject is the subject the request is stored under.
	Subject string
	// Lane is the lane it is queued in: Subject's, as the queue read it (zero for a dead
	// letter's request, which is queued in none).
	Lane Lane
	// AcceptedAt is when the queue stored it (the server's clock).
	AcceptedAt time.Time
}

// Verdict says why a request was given up: moved to the dead-letter stream unsent or
// undelivered.
type Verdict struct {
	Reason       Reason    `json:"reason"`               // one of the Reason constants
	LastStatus   int       `json:"lastStatus,omitempty"` // raven's last HTTP status, 0 when there was none
	LastError    string    `json:"lastError,omitempty"`  // the last error, empty when raven answered
	Attempts     int       `json:"attempts"`
	FirstAttempt time.Time `json:"firstAttempt,omitzero"`
	LastAttempt  time.Time `json:"lastAttempt,omitzero"`
	// Answer is raven's answer to the last attempt, for the dead_lettered event (nil when
	// raven did not answer). The dead-letter stream does not keep it.
	Answer *Response `json:"-"`
}

// DeadLetter is a request in the dead-letter stream, as operators see it: the request,
// the Verdict, and when it went there.
type DeadLetter struct {
	Seq        uint64    `json:"seq"` // its sequence in the dead-letter stream
	ID         string    `json:"id"`
	ClientID   string    `json:"clientId"` // empty when its subject held no valid token
	AcceptedAt time.Time `json:"acceptedAt,omitzero"`
	Verdict
	DeadAt      time.Time `json:"deadAt"`
	BodyBytes   int       `json:"bodyBytes"`
	ContentType string    `json:"-"`
	Body        []byte    `json:"-"`
	Subject     string    `json:"-"` // its subject in the dead-letter stream
	// Headers are the stored message's headers, as the dead-letter stream holds them.
	Headers map[string][]string `json:"-"`
	// Cycle is how many times the request was replayed before it came here.
	Cycle int `json:"cycle,omitempty"`
	// NotBefore is the request's Not-Before, when it had one.
	NotBefore time.Time `json:"-"`
	// TraceParent and TraceState are its request's trace context, when it had one.
	TraceParent string `json:"-"`
	TraceState  string `json:"-"`
}

// ReplayNotBefore is the Not-Before d's request keeps when it is replayed at now: its own
// while that is still ahead (a request purged before its time must not go early), none
// once it has passed.
func (d DeadLetter) ReplayNotBefore(now time.Time) time.Time {
	if d.NotBefore.After(now) {
		return d.NotBefore
	}
	return time.Time{}
}

// Reason is why a request was dead-lettered.
type Reason string

// The reasons for dead-lettering.
const (
	ReasonPermanent         Reason = "permanent"
	ReasonAttemptsExhausted Reason = "attempts_exhausted"
	ReasonAgeExhausted      Reason = "age_exhausted"
	ReasonUndecodable       Reason = "undecodable"
	ReasonPurged            Reason = "purged"  // an operator purged the client's backlog
	ReasonExpired           Reason = "expired" // its Not-After passed before an attempt started
)

// Reasons lists every reason for dead-lettering.
var Reasons = []Reason{ReasonPermanent, ReasonAttemptsExhausted, ReasonAgeExhausted, ReasonUndecodable, ReasonPurged, ReasonExpired}

// ParseReason reads a reason as a caller names it.
func ParseReason(s string) (Reason, error) {
	for _, r := range Reasons {
		if s == string(r) {
			return r, nil
		}
	}
	names := make([]string, len(Reasons))
	for i, r := range Reasons {
		names[i] = string(r)
	}
	return "", fmt.Errorf("reason %q: one of %s", s, strings.Join(names, ", "))
}

// Expired says whether st may no longer be attempted at now: its Not-After has passed.
func (st Stored) Expired(now time.Time) bool {
	return !st.NotAfter.IsZero() && now.After(st.NotAfter)
}

// Receipt is what the queue says about a request it accepted.
type Receipt struct {
	// Seq is the request's sequence in the queue's stream.
	Seq uint64
	// Duplicate is true when the same id was accepted before, within the duplicate window;
	// Seq is then the first copy's.
	Duplicate bool
}
