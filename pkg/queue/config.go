package queue

import (
	"errors"
	"fmt"
	"time"
)

// Stream names (the subjects are request.RequestPrefix and request.DeadLetterPrefix).
const (
	RequestStream    = "REQUESTS"
	DeadLetterStream = "DEADLETTER"
)

// Defaults for Config.
const (
	DefaultPartitions      = 64
	DefaultReplicas        = 1
	DefaultBacklogCap      = 10_000
	DefaultDuplicateWindow = 2 * time.Minute
	DefaultAckTimeout      = 5 * time.Second
)

// Config describes the streams. The dispatcher creates or updates them at start; ingest
// only creates them when they are missing, so one deployment's settings come from one
// place.
type Config struct {
	// Partitions is how many partitions client subjects are spread over. It is fixed when
	// the stream is created; changing it needs a new stream (see docs/adr). Defaults to 64.
	Partitions int
	// Replicas is the stream replica count: 1 on a single node, 3 on a cluster.
	// Defaults to 1.
	Replicas int
	// BacklogCap is the most requests one client may have queued; past it ingest answers
	// 429. Defaults to 10000.
	BacklogCap int64
	// MaxBytes caps the request stream's size; past it ingest answers 503. Zero or less
	// means no cap beyond the server's own storage limits. Defaults to no cap.
	MaxBytes int64
	// DuplicateWindow is how long an Idempotency-Key is remembered. Defaults to 2m.
	DuplicateWindow time.Duration
	// DeadLetterMaxAge is how long dead letters are kept; zero keeps them until removed.
	// Defaults to 0 (forever).
	DeadLetterMaxAge time.Duration
	// StatusRetention is how long request events, and so each request's status, are
	// kept. Defaults to 24h.
	StatusRetention time.Duration
	// EventsMaxBytes caps the events stream's size; past it the oldest events go. Zero or
	// less means no cap beyond StatusRetention. Defaults to no cap.
	EventsMaxBytes int64
	// NoEvents says this process neither writes nor reads requests' events (EVENTS=false):
	// Open leaves the events stream alone (neither creates nor updates it) and Ready does
	// not need it. Defaults to false: events on.
	NoEvents bool
	// NoBodyReads says this process's NATS user may not read queued requests (the ingest
	// role, RoleIngest): Place then tells a request at the head of its client's queue only
	// when it is the client's only one, and never asks for the head (the read would be
	// refused, and would wait out its deadline for an answer). Defaults to false.
	NoBodyReads bool
	// HealthRole, when set, makes this process's test write (WatchWrites) a marker
	// written to the health stream on that role's subject (HealthSubject) instead of the
	// removal of a missing request from the request stream: for a NATS user that may not
	// remove requests (RoleIngest). Such test writes do not prove the link head reads go
	// through (ProveHeadReads), which only the dispatcher's need. Defaults to empty: the
	// removal.
	HealthRole Role
	// AckTimeout bounds the wait for JetStream's acknowledgement of a publish made without
	// waiting for it (batches, events): past it the publish fails as request.ErrUnavailable, and
	// stops holding one of the connection's slots for pending publishes. An acknowledgement
	// can be lost with the connection still up (a server cut off from its cluster's
	// majority answers nothing); without this bound such publishes would stay pending for
	// good, and once the slots are full every publish without waiting would fail. Set it
	// no shorter than the longest a caller waits (ingest's PUBLISH_TIMEOUT). Defaults to 5s.
	AckTimeout time.Duration
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Partitions == 0 {
		c.Partitions = DefaultPartitions
	}
	if c.Replicas == 0 {
		c.Replicas = DefaultReplicas
	}
	if c.BacklogCap == 0 {
		c.BacklogCap = DefaultBacklogCap
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = DefaultDuplicateWindow
	}
	if c.StatusRetention == 0 {
		c.StatusRetention = DefaultStatusRetention
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = DefaultAckTimeout
	}
	return c
}

// Validate reports the first field that cannot work, and what it accepts.
func (c Config) Validate() error {
	var errs []error
	if c.Partitions < 1 || c.Partitions > 1024 {
		errs = append(errs, fmt.Errorf("partitions %d: must be 1 to 1024", c.Partitions))
	}
	if c.Replicas != 1 && c.Replicas != 3 && c.Replicas != 5 {
		errs = append(errs, fmt.Errorf("replicas %d: must be 1, 3 or 5", c.Replicas))
	}
	if c.BacklogCap < 1 {
		errs = append(errs, fmt.Errorf("backlog cap %d: must be at least 1", c.BacklogCap))
	}
	if c.DuplicateWindow < time.Second {
		errs = append(errs, fmt.Errorf("duplicate window %s: must be at least 1s", c.DuplicateWindow))
	}
	// A stream's duplicate window may not outlast its messages: the server refuses it.
	if c.DeadLetterMaxAge < 0 || (c.DeadLetterMaxAge > 0 && c.DeadLetterMaxAge < c.DuplicateWindow) {
		errs = append(errs, fmt.Errorf("dead-letter max age %s: must be 0 (forever) or at least the duplicate window (%s)", c.DeadLetterMaxAge, c.DuplicateWindow))
	}
	if c.StatusRetention < time.Minute {
		errs = append(errs, fmt.Errorf("status retention %s: must be at least 1m", c.StatusRetention))
	} else if !c.NoEvents && c.StatusRetention < c.DuplicateWindow {
		errs = append(errs, fmt.Errorf("status retention %s: must be at least the duplicate window (%s)", c.StatusRetention, c.DuplicateWindow))
	}
	if c.AckTimeout <= 0 {
		errs = append(errs, fmt.Errorf("ack timeout %s: must be positive", c.AckTimeout))
	}
	return errors.Join(errs...)
}
