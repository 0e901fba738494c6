package dispatch

import (
	"context"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Source is the queue as the dispatcher sees it.
type Source interface {
	// Partitions is how many partitions the clients' lanes are spread over.
	Partitions() int
	// PartitionBacklog lists the lanes of partition p that have requests queued.
	PartitionBacklog(ctx context.Context, p int) (map[request.Lane]uint64, error)
	// Watch calls fn with the lane of each request stored from now on in one of
	// partitions (at least one); onErr hears of trouble after which a backlog listing is
	// due. Once it has returned, a listing of one of the partitions misses nothing that
	// the watch does not give.
	Watch(ctx context.Context, partitions []int, fn func(request.Lane), onErr func(error)) (stop func(), err error)
	// Head reads the oldest request of lane; ok is false when there is none. A request
	// that cannot be sent (its lane's token names no client) comes with ok true and a
	// *request.UndecodableError: it is dead-lettered unsent.
	Head(ctx context.Context, lane request.Lane) (st request.Stored, ok bool, err error)
	// Find looks for the queued request id in lane, reading its headers only (no body);
	// ok is false when it is not queued there.
	Find(ctx context.Context, lane request.Lane, id string) (st request.Stored, ok bool, err error)
	// Delete removes request seq (its request.Stored.Seq) from lane; for one already
	// gone the error wraps request.ErrNotQueued.
	Delete(ctx context.Context, lane request.Lane, seq uint64) error
	// AddDeadLetter writes a request to the dead-letter stream (it stays in the queue).
	AddDeadLetter(ctx context.Context, st request.Stored, why request.Verdict) error
	// KeepOutcome keeps a final event that Events did not write in time in the queue's
	// own store, where the removal that follows it is written: a crash after the removal
	// cannot lose it, and it reaches the events later. An error means it was not kept;
	// the store too full to keep it is no error (the removal goes ahead).
	KeepOutcome(ctx context.Context, e request.Event) error
}

// Events records requests' outcomes (the queue's event writer). Neither method may hold
// up a lane for long: Record only queues the event, WriteNow waits for its write up to
// ctx and otherwise leaves it queued.
type Events interface {
	Record(e request.Event)
	// WriteNow writes a final event before the request leaves the queue, and says
	// whether it was written; one that was not is kept with Source.KeepOutcome before
	// the removal, so that a crash right after the removal cannot lose it.
	WriteNow(ctx context.Context, e request.Event) (written bool)
}

// AttemptRecord reads what the record holds of a request's attempts (the queue's
// events): how many were made of the request queued as st, by any instance, and when
// one of them was (MaxAge counts from it). It finds none where it keeps none.
type AttemptRecord interface {
	EarlierAttempts(ctx context.Context, st request.Stored) (n int, at time.Time, err error)
}

// SteeringSource is where operators' steering (request.Steering) comes from, shared by
// every instance.
type SteeringSource interface {
	// WatchSteering returns the steering in force now, then calls fn with every later
	// change until stopped. A change with an empty Client sets the global interval (zero:
	// back to the configured one).
	WatchSteering(ctx context.Context, fn func(request.SteerChange)) (current []request.SteerChange, stop func(), err error)
}

// Sender makes one attempt of a request. It returns nil when raven accepted it. A
// *request.PermanentError is not retried; a *request.TransientError's After delays the
// retry; either's Status is recorded; an error that Is request.ErrNoAnswerInTime counts
// as raven overloaded.
type Sender interface {
	Send(ctx context.Context, st request.Stored, attempt int) error
}

// AnswerSender is a Sender that also gives raven's answer to the attempt (nil when raven
// did not answer), which the record keeps with the attempt's outcome (issue 31).
type AnswerSender interface {
	Sender
	SendAnswer(ctx context.Context, st request.Stored, attempt int) (*request.Response, error)
}

// clock is where the dispatcher reads the time: time.Now, or a test's.
type clock func() time.Time
