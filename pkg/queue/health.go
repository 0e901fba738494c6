package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// HealthStream holds the test writes (WatchWrites) of the services whose NATS user may
// not remove from the request stream (Config.HealthRole; ingest): a marker per role, on
// the role's own subject (HealthSubject), the newest only. It holds nothing else.
const HealthStream = "HEALTH"

// healthPrefix is the health stream's subjects: one per role.
const healthPrefix = "dispatch.health."

// HealthSubject is where role's test writes go: the only subject of the health stream its
// user may publish to.
func HealthSubject(r Role) string { return healthPrefix + string(r) }

const (
	// healthMarkBytes is the size of a test write's marker: a page. A write of less can
	// land in the room left in the last page of the stream's file, which a full disk still
	// takes (seen on a full tmpfs: one-byte markers went on being stored); one of a page
	// or more needs a new one.
	healthMarkBytes = 4096
	// healthMaxAge is how long a marker is kept: none is read, and the newest of each
	// role is all the stream keeps anyway.
	healthMaxAge = time.Minute
	// healthMaxBytes bounds the stream (a few markers), which also makes its files small
	// (nats-server sizes a stream's blocks from it: 32 kB).
	healthMaxBytes = 64 << 10
)

// healthMark is the body of every marker.
var healthMark = []byte(strings.Repeat(".", healthMarkBytes))

func healthStreamConfig(cfg Config) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        HealthStream,
		Description: "Test writes of the services whose NATS user may not remove requests (ingest): whether the store takes writes. Nothing else.",
		Subjects:    []string{healthPrefix + "*"},
		Retention:   jetstream.LimitsPolicy,
		// On the same storage and replicas as the request stream: a write here is one
		// there would be.
		Storage:           jetstream.FileStorage,
		Replicas:          cfg.Replicas,
		Discard:           jetstream.DiscardOld,
		MaxMsgsPerSubject: 1,
		MaxAge:            healthMaxAge,
		MaxMsgs:           -1,
		MaxBytes:          healthMaxBytes,
	}
}

// probeHealth is the test write of a user that may not remove requests: a marker written
// to the health stream on role's subject, a write a store that cannot write refuses
// (replicated on a cluster, as the request stream's writes are). nats-server does not
// answer a write its store refused, it keeps the error instead, and gives it in answer
// to a later change to the stream: so the probe asks for it by removing a marker that
// does not exist, before the write (the error of an earlier failed one: no need to write
// again) and after a write that got no answer. Each step waits probeTimeout at most.
func (q *Queue) probeHealth(ctx context.Context, role Role) error {
	if err := removeMissing(ctx, q.health, HealthStream); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, probeTimeout)
	_, err := q.js.Publish(wctx, HealthSubject(role), healthMark, jetstream.WithExpectStream(HealthStream))
	cancel()
	if err == nil {
		return nil
	}
	err = fmt.Errorf("test write to stream %s: %w", HealthStream, err)
	if !unanswered(err) {
		return err
	}
	if askErr := removeMissing(ctx, q.health, HealthStream); askErr != nil && isStoreFailure(askErr) {
		return askErr
	}
	return err
}

// removeMissing removes a message that does not exist (probeSeq) from stream s, named
// name, within probeTimeout: nil when the stream answers that it has no such message (a
// healthy store), else its answer (nats-server gives a failed write's error in answer to
// every later change) or why none came.
func removeMissing(ctx context.Context, s jetstream.Stream, name string) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	err := s.DeleteMsg(ctx, probeSeq)
	if err == nil || isNotFound(err) || strings.Contains(err.Error(), "stream store EOF") {
		return nil
	}
	return fmt.Errorf("test write to stream %s: %w", name, err)
}

// unanswered says whether a publish got no answer from the stream: the answer a store
// that refused the write gives.
func unanswered(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrNoResponders)
}
