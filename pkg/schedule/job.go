package schedule

import (
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Job is one lane handed to a worker: look at the client's head request and, if there is
// one, make one attempt, starting it no sooner than SendAt.
type Job struct {
	Lane request.Lane
	// SendAt is the earliest the attempt may start. A job is handed out up to the
	// scheduler's lead before it, so that the head request is read in advance and the
	// attempt starts on time whatever the queue's latency.
	SendAt time.Time
	// HeadSeq, Attempts and FirstAttempt describe earlier failed attempts of the request
	// that was at the head last time; Attempts is 0 when there were none.
	HeadSeq      uint64
	Attempts     int
	FirstAttempt time.Time
	// PrevEnd is when the client's previous attempt ended; zero if none is remembered.
	PrevEnd time.Time
	// Interval is the client's interval in force when the job was handed out.
	Interval time.Duration
	// Since is the lane's fence: an attempt by an earlier owner of the client may have
	// ended as late as this (zero: none can have).
	Since time.Time
	// Paused says the client is paused: the worker sends nothing, only purges.
	Paused bool
	// PurgeThrough asks the worker to dead-letter, unsent, every request of the client
	// with a sequence up to this one (0: none).
	PurgeThrough uint64
}

// Kind says how a Job ended.
type Kind int

// The ways a Job ends.
const (
	// Empty: the client has nothing queued.
	Empty Kind = iota
	// Delivered: raven accepted the head request and it was removed.
	Delivered
	// Retry: the attempt failed transiently; the request stays at the head.
	Retry
	// DeadLettered: the request was moved to the dead-letter stream and removed.
	DeadLettered
	// Failed: the queue could not be read; nothing was sent.
	Failed
	// Held: nothing was sent because the partition's lease might lapse first.
	Held
	// Parked: the client is paused and has nothing to purge; the lane waits for a resume.
	Parked
	// NotYet: the head request's not-before time is later than the job's SendAt; the lane
	// waits until then. Nothing was sent.
	NotYet
)

// Result is what a worker reports back for a Job.
type Result struct {
	Lane request.Lane
	Kind Kind
	// For Retry: the request's sequence, the attempt number just made and when the first
	// attempt started.
	Seq          uint64
	Attempts     int
	FirstAttempt time.Time
	// AttemptEnd is when the HTTP attempt ended; zero when no attempt was made.
	AttemptEnd time.Time
	// RetryAfter is raven's Retry-After for a Retry, zero when it gave none.
	RetryAfter time.Duration
	// NotBefore is, for NotYet, the head request's not-before time.
	NotBefore time.Time
	// For an attempt, what raven's budget learns from it: how long it took, whether raven
	// refused it as overloaded (429, 503, or a timeout), and for a 503 with Retry-After
	// how long raven asked every sender to wait.
	Took     time.Duration
	Refused  bool
	PauseAll time.Duration
}
