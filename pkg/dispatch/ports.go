package dispatch

import (
	"context"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Source is the queue as the dispatcher sees it.
type Source interface {
	// Partitions is how many partitions client subjects are spread over.
	Partitions() int
	// PartitionBacklog lists the subjects of partition p that have requests queued.
	PartitionBacklog(ctx context.Context, p int) (map[string]uint64, error)
	// Watch calls fn with the subject of each request stored from now on; onErr hears of
	// trouble after which a backlog listing is due.
	Watch(ctx context.Context, fn func(subject string), onErr func(error)) (stop func(), err error)
	// Head reads the oldest request on subject; ok is false when there is none. A request
	// that cannot be sent (its subject names no client) comes with ok true and a
	// *request.UndecodableError: it is dead-lettered unsent.
	Head(ctx context.Context, subject string) (st request.Stored, ok bool, err error)
	// Find looks for the queued request id on subject, reading its headers only (no
	// body); ok is false when it is not queued there.
	Find(ctx context.Context, subject, id string) (st request.Stored, ok bool, err error)
	// Delete removes a request; one already gone is not an error.
	Delete(ctx context.Context, seq uint64) error
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

// Steering is where operators' steering comes from, shared by every instance.
type Steering interface {
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

// LeaseStore keeps partition leases that expire unless renewed, in a store all
// dispatcher instances share (the queue's KV bucket).
type LeaseStore interface {
	// Heartbeat says instance id is alive for another TTL; Leave says it is gone.
	Heartbeat(ctx context.Context, id string) error
	Leave(ctx context.Context, id string) error
	// Members lists the instances alive now.
	Members(ctx context.Context) ([]string, error)
	// Acquire takes partition p if nobody holds it; ok is false when somebody does.
	Acquire(ctx context.Context, p int, owner string) (rev uint64, ok bool, err error)
	// Renew extends owner's lease by compare-and-swap on rev; ok is false when it is gone.
	Renew(ctx context.Context, p int, owner string, rev uint64) (newRev uint64, ok bool, err error)
	// Release gives p up if rev is still current.
	Release(ctx context.Context, p int, rev uint64) error
	// ReleaseAll gives up every lease held by owner, at whatever revision.
	ReleaseAll(ctx context.Context, owner string) (int, error)
	// Written says whether anything (a lease, a heartbeat) was ever written to the store.
	// A watch sees every renewal of a store never written to when it began; otherwise a
	// lease renewed and then removed early by the store's clock before the watch began
	// went unseen, and partitions taken over wait a TTL (see the leaser).
	Written(ctx context.Context) (bool, error)
	// WatchLeases calls fn with every lease taken, renewed or released and every
	// heartbeat written or removed, those in place first, each with the store's revision
	// of the change; lost hears that the watch ended before it was stopped.
	WatchLeases(ctx context.Context, fn func(request.LeaseChange), lost func(error)) (stop func(), err error)
}

// clock is where the dispatcher reads the time: time.Now, or a test's.
type clock func() time.Time
