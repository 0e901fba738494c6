package queue

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Queue is the service's JetStream on one connection: the request and dead-letter
// streams it holds open, and through the same connection the events stream (the event
// writer's sink in events.go, reads in eventread.go), the lease, control and steering buckets, and the
// dispatchers' asks (lanes, queued requests, cancels).
type Queue struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	cfg    Config
	reqs   jetstream.Stream
	dead   jetstream.Stream
	health jetstream.Stream // the test writes' stream, with Config.HealthRole (health.go)
	writes writeHealth
	proof  *linkProof // head reads only through a server a write went through (link.go)
	guard  StoreGuard // set by UseGuard when the server runs in this process
	// outcomes count the final events kept in the request stream (KeepOutcome).
	outcomes outcomeMetrics

	batchMu    sync.Mutex // PublishAll's choice of atomic batches (ADR 11)
	batchCosts writeCosts
}

const maxPendingPublishes = 16384

// Ensure says what Open does with the streams.
type Ensure int

const (
	// CreateOrUpdate creates the streams that do not exist and brings existing ones'
	// settings in line with the Config: the dispatchers', the only role that may.
	CreateOrUpdate Ensure = iota
	// Existing opens the streams as they are, taking partitions and replicas from them,
	// and fails if they are missing: for tools that must not create or change anything.
	Existing
)

// Open returns the Queue. With CreateOrUpdate it creates the streams, or brings them in
// line with cfg: the request, dead-letter and health streams, and the events stream
// unless cfg.NoEvents; it fails if the request stream exists with another partition
// count, since re-partitioning in place would file one client under two partitions. With
// Existing it opens them as they are (ErrStreamsMissing while one is missing).
func Open(ctx context.Context, nc *nats.Conn, cfg Config, ensure Ensure) (*Queue, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// Batches and events publish many messages at once; past this many waiting for an
	// acknowledgement, a publish waits (then fails) instead of queueing more. One whose
	// acknowledgement does not come within AckTimeout fails and frees its slot.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(maxPendingPublishes),
		jetstream.WithPublishAsyncTimeout(cfg.AckTimeout))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	q := &Queue{nc: nc, js: js, cfg: cfg, writes: writeHealth{log: zerolog.Nop()}, proof: newLinkProof(), outcomes: newOutcomeMetrics()}
	if ensure == Existing {
		return q.openExisting(ctx)
	}
	// Whoever creates and updates the other streams keeps this one in line too, used or
	// not: ingest's test writes go there (HealthRole), the dispatcher's do not. First: a
	// stream just created on a cluster has no leader for a moment, and the first test
	// write follows Open at once.
	if q.health, err = q.ensure(ctx, healthStreamConfig(cfg)); err != nil {
		return nil, err
	}
	if q.reqs, err = q.ensure(ctx, requestStreamConfig(cfg)); err != nil {
		return nil, err
	}
	if err := checkPartitions(q.reqs.CachedInfo().Config, cfg.Partitions); err != nil {
		return nil, err
	}
	if q.dead, err = q.ensure(ctx, deadLetterStreamConfig(cfg)); err != nil {
		return nil, err
	}
	if !cfg.NoEvents {
		if _, err = q.ensure(ctx, eventStreamConfig(cfg)); err != nil {
			return nil, err
		}
	}
	return q, nil
}

// ErrStreamsMissing is Open's error, with Existing, when a stream it needs does not
// exist yet: only the dispatchers create them, and a service that may not (ingest) waits
// for one to have started once.
var ErrStreamsMissing = errors.New("start a dispatcher once to create the streams")

// openExisting opens the streams as they are: the request and dead-letter streams, and
// for a service with test writes of its own (HealthRole: ingest) the health stream and,
// with events on, the events stream, which it writes to.
func (q *Queue) openExisting(ctx context.Context) (*Queue, error) {
	type named struct {
		name string
		s    *jetstream.Stream
	}
	var events jetstream.Stream
	streams := []named{{RequestStream, &q.reqs}, {DeadLetterStream, &q.dead}}
	if q.cfg.HealthRole != "" {
		streams = append(streams, named{HealthStream, &q.health})
		if !q.cfg.NoEvents {
			streams = append(streams, named{EventStream, &events})
		}
	}
	for _, st := range streams {
		var err error
		if *st.s, err = q.js.Stream(ctx, st.name); err != nil {
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return nil, fmt.Errorf("stream %s does not exist: %w", st.name, ErrStreamsMissing)
			}
			return nil, fmt.Errorf("stream %s: %w", st.name, err)
		}
	}
	cfg := q.reqs.CachedInfo().Config
	if cfg.SubjectTransform == nil {
		return nil, fmt.Errorf("stream %s has no partitioning subject transform; it was not created by this service", RequestStream)
	}
	var n int
	if _, err := fmt.Sscanf(cfg.SubjectTransform.Destination, request.RequestPrefix+"{{partition(%d,1)}}", &n); err != nil || n < 1 {
		return nil, fmt.Errorf("stream %s is partitioned as %q, which this service does not read", RequestStream, cfg.SubjectTransform.Destination)
	}
	q.cfg.Partitions, q.cfg.Replicas, q.cfg.DuplicateWindow = n, cfg.Replicas, cfg.Duplicates
	return q, nil
}

func requestStreamConfig(cfg Config) jetstream.StreamConfig {
	maxBytes := cfg.MaxBytes
	if maxBytes <= 0 {
		maxBytes = -1
	}
	return jetstream.StreamConfig{
		Name:        RequestStream,
		Description: "Accepted requests, one subject per client, waiting for dispatch.",
		// Kept final events (KeepOutcome) share the stream with the requests whose removal
		// they come before; the transform does not touch their subjects.
		Subjects: []string{request.RequestPrefix + "*", request.OutcomePrefix + "*"},
		SubjectTransform: &jetstream.SubjectTransformConfig{
			Source:      request.RequestPrefix + "*",
			Destination: fmt.Sprintf("%s{{partition(%d,1)}}.{{wildcard(1)}}", request.RequestPrefix, cfg.Partitions),
		},
		Retention:            jetstream.LimitsPolicy,
		Storage:              jetstream.FileStorage,
		Replicas:             cfg.Replicas,
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		MaxMsgsPerSubject:    cfg.BacklogCap,
		MaxBytes:             maxBytes,
		MaxMsgs:              -1,
		Duplicates:           cfg.DuplicateWindow,
		AllowDirect:          directGets(cfg),
		// PublishAll stores a batch's requests as one atomic batch when that has been
		// cheaper (ADR 11).
		AllowAtomicPublish: true,
	}
}

// directGets says whether head reads may be direct gets. A direct get is answered by any
// replica, and a follower that lags may not have a new request yet (the lane would find
// its client empty) or may still hold a delivered one (it would be sent again); so with
// replicas, reads go through the stream leader.
func directGets(cfg Config) bool { return cfg.Replicas == 1 }

func deadLetterStreamConfig(cfg Config) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        DeadLetterStream,
		Description: "Requests that failed for good, with headers saying why. Replay moves them back.",
		Subjects:    []string{request.DeadLetterPrefix + "*"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Discard:     jetstream.DiscardNew,
		MaxAge:      cfg.DeadLetterMaxAge,
		MaxMsgs:     -1,
		MaxBytes:    -1,
		Duplicates:  cfg.DuplicateWindow,
		AllowDirect: directGets(cfg),
	}
}

func checkPartitions(have jetstream.StreamConfig, want int) error {
	if have.SubjectTransform == nil {
		return fmt.Errorf("stream %s has no partitioning subject transform; it was not created by this service", RequestStream)
	}
	wantDest := requestStreamConfig(Config{Partitions: want}).SubjectTransform.Destination
	if have.SubjectTransform.Destination != wantDest {
		return fmt.Errorf("stream %s is partitioned as %q but PARTITIONS asks for %q: the partition count is fixed when the stream is created (see docs/adr/0001-lanes-not-consumers.md)",
			RequestStream, have.SubjectTransform.Destination, wantDest)
	}
	return nil
}

func (q *Queue) ensure(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	s, err := q.js.Stream(ctx, cfg.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		s, err = q.js.CreateStream(ctx, cfg)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) { // another instance won the race
			s, err = q.js.Stream(ctx, cfg.Name)
		}
	case err == nil:
		// Keep the partitioning as found: checkPartitions reports a mismatch.
		cfg.SubjectTransform = s.CachedInfo().Config.SubjectTransform
		s, err = q.js.UpdateStream(ctx, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", cfg.Name, err)
	}
	return s, nil
}

// Ready reports whether JetStream answers, the streams are in place (the events stream
// only with events on) and the store takes writes (WriteErr).
func (q *Queue) Ready(ctx context.Context) error {
	if !q.nc.IsConnected() {
		return fmt.Errorf("not connected to NATS (%s)", q.nc.Status())
	}
	streams := []string{RequestStream, DeadLetterStream, EventStream}
	if q.cfg.NoEvents {
		streams = streams[:2]
	}
	for _, name := range streams {
		if _, err := q.js.Stream(ctx, name); err != nil {
			return fmt.Errorf("stream %s: %w", name, err)
		}
	}
	if err := q.WriteErr(); err != nil {
		return fmt.Errorf("the store does not take writes: %w", err)
	}
	return nil
}

// Partitions is the request stream's partition count.
func (q *Queue) Partitions() int { return q.cfg.Partitions }
