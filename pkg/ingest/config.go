package ingest

import (
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// HeaderRoom is what a stored request's headers may take beside its body in one NATS
// message.
const HeaderRoom = 4 << 10

// Defaults for Config. DefaultMaxBodyBytes fits NATS's default max_payload (1 MiB) with
// the headers.
const (
	DefaultMaxBodyBytes   = 1<<20 - HeaderRoom
	DefaultPublishTimeout = 5 * time.Second
	DefaultBacklogRetry   = 5 * time.Second
	DefaultMaxPublishing  = 4096
	DefaultBodyTimeout    = 10 * time.Second
	DefaultMaxNotBefore   = 7 * 24 * time.Hour
	DefaultBatchMaxItems  = 1000
	DefaultBatchMaxBytes  = 10 << 20
	DefaultMaxStatusWait  = 60 * time.Second
	DefaultMaxStatusWaits = 1000
	DefaultMaxStatusReads = 500
	DefaultBatchInFlight  = 64 << 20
)

// Config configures the API.
type Config struct {
	// MaxBodyBytes caps a request body; a larger one gets 413. Defaults to 1 MiB.
	MaxBodyBytes int64
	// PublishTimeout bounds the wait for the queue's acknowledgement; past it the caller
	// gets 503. Defaults to 5s.
	PublishTimeout time.Duration
	// BacklogRetryAfter is the Retry-After sent with 429 when a client's backlog is full:
	// a slot frees once per dispatch interval. Defaults to 5s.
	BacklogRetryAfter time.Duration
	// Metrics, if not nil, counts requests by outcome and publish latency.
	Metrics *Metrics
	// Tracing, if not nil, records each accepted request as a span, continuing the
	// caller's W3C trace context, and stores the span's context with the request.
	Tracing trace.TracerProvider
	// Tokens, if not nil, are the bearer tokens every route but the probes requires, each
	// with its scope; nil accepts requests from anyone, for any client.
	Tokens *Tokens
	// Backlogs, if not nil, lists the clients with requests queued: a token's clients
	// with a backlog are counted against its share from it. Without it that share is not
	// enforced.
	Backlogs BacklogLister
	// MaxPublishing bounds the publishes waiting for JetStream at once; past it a request
	// gets 503 at once instead of queueing in memory. Defaults to 4096.
	MaxPublishing int
	// BodyTimeout bounds the reading of one request's body, from when the handler starts
	// it: a caller that sends less than its Content-Length promised gets 408 then,
	// instead of holding the connection for the server's whole read timeout. Defaults to
	// 10s.
	BodyTimeout time.Duration
	// MaxNotBefore is how far ahead a Not-Before may be; further is a 400. Defaults to 7
	// days.
	MaxNotBefore time.Duration
	// BatchMaxItems and BatchMaxBytes bound one batch; past either the batch gets 413.
	// Default to 1000 items and 10 MiB.
	BatchMaxItems int
	BatchMaxBytes int64
	// MaxStatusWait caps a status read's ?wait. Defaults to 60s.
	MaxStatusWait time.Duration
	// MaxStatusWaits bounds the status reads waiting (?wait) at once, each holding a
	// watch on the events; past it a read that asks to wait gets 503 at once. Defaults to
	// 1000.
	MaxStatusWaits int
	// MaxStatusReads bounds the status reads without ?wait being read at once (each
	// holds its connection and a read of the store, up to 5 s when NATS is slow); past it
	// a read gets 503 overloaded at once. Defaults to 500.
	MaxStatusReads int
	// BatchInFlightBytes bounds the bytes of the batches being read and stored at once
	// (a batch without Content-Length counts as BatchMaxBytes); past it a batch gets 503
	// before its body is read. Defaults to 64 MiB; at least BatchMaxBytes.
	BatchInFlightBytes int64
	// Live, if not nil, announces every request stored (its accepted event) to whoever
	// listens now; nothing stores it (ADR 18).
	Live Announcer
	// Status, if not nil, serves GET /v1/requests/{id}; without it that route answers
	// 501.
	Status StatusReader
	// Instance names this process in the accepted events it announces.
	Instance string
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.BacklogRetryAfter == 0 {
		c.BacklogRetryAfter = DefaultBacklogRetry
	}
	if c.MaxPublishing == 0 {
		c.MaxPublishing = DefaultMaxPublishing
	}
	if c.BodyTimeout == 0 {
		c.BodyTimeout = DefaultBodyTimeout
	}
	if c.MaxNotBefore == 0 {
		c.MaxNotBefore = DefaultMaxNotBefore
	}
	if c.BatchMaxItems == 0 {
		c.BatchMaxItems = DefaultBatchMaxItems
	}
	if c.BatchMaxBytes == 0 {
		c.BatchMaxBytes = DefaultBatchMaxBytes
	}
	if c.MaxStatusWait == 0 {
		c.MaxStatusWait = DefaultMaxStatusWait
	}
	if c.MaxStatusWaits == 0 {
		c.MaxStatusWaits = DefaultMaxStatusWaits
	}
	if c.MaxStatusReads == 0 {
		c.MaxStatusReads = DefaultMaxStatusReads
	}
	if c.BatchInFlightBytes == 0 {
		c.BatchInFlightBytes = max(DefaultBatchInFlight, c.BatchMaxBytes)
	}
	return c
}

// Validate reports every field that cannot work.
func (c Config) Validate() error {
	var errs []error
	if c.MaxBodyBytes < 1 {
		errs = append(errs, fmt.Errorf("max body bytes %d: must be at least 1", c.MaxBodyBytes))
	}
	if c.PublishTimeout <= 0 {
		errs = append(errs, fmt.Errorf("publish timeout %s: must be positive", c.PublishTimeout))
	}
	if c.BacklogRetryAfter <= 0 {
		errs = append(errs, fmt.Errorf("backlog retry-after %s: must be positive", c.BacklogRetryAfter))
	}
	if c.MaxPublishing < 1 {
		errs = append(errs, fmt.Errorf("max publishing %d: must be at least 1", c.MaxPublishing))
	}
	if c.BodyTimeout <= 0 {
		errs = append(errs, fmt.Errorf("body timeout %s: must be positive", c.BodyTimeout))
	}
	if c.MaxNotBefore <= 0 {
		errs = append(errs, fmt.Errorf("max not-before %s: must be positive", c.MaxNotBefore))
	}
	if c.BatchMaxItems < 1 {
		errs = append(errs, fmt.Errorf("batch max items %d: must be at least 1", c.BatchMaxItems))
	}
	if c.BatchMaxBytes < 1 {
		errs = append(errs, fmt.Errorf("batch max bytes %d: must be at least 1", c.BatchMaxBytes))
	}
	if c.MaxStatusWait <= 0 {
		errs = append(errs, fmt.Errorf("max status wait %s: must be positive", c.MaxStatusWait))
	}
	if c.MaxStatusWaits < 1 {
		errs = append(errs, fmt.Errorf("max status waits %d: must be at least 1", c.MaxStatusWaits))
	}
	if c.MaxStatusReads < 1 {
		errs = append(errs, fmt.Errorf("max status reads %d: must be at least 1", c.MaxStatusReads))
	}
	if c.BatchInFlightBytes < c.BatchMaxBytes {
		errs = append(errs, fmt.Errorf("batch in-flight bytes %d: must be at least the batch max bytes (%d), or no batch of the largest size could ever be taken", c.BatchInFlightBytes, c.BatchMaxBytes))
	}
	return errors.Join(errs...)
}
