// Package admin is what operators do to a running service: inspect clients, requests
// and dead letters, replay dead letters, and steer the dispatchers (intervals, pause,
// purge). The dispatchctl command and the dispatcher's admin HTTP API are both thin
// layers over it; neither ever deletes a request outright (a cancel is asked of the
// dispatcher that owns the request's client, which removes it).
package admin

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/tracing"
)

// ErrInvalid marks an operator's mistake (a bad filter, a missing confirmation): the
// error text says what to change.
var ErrInvalid = errors.New("invalid")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// ErrConflict marks an operation the thing's state does not allow now (a cancel of a
// request in flight, or ended); ErrNotFound one on a thing that is not there;
// ErrUnavailable one that cannot be made just now (no dispatcher owns the client, say).
// The error text says what to do.
var (
	ErrConflict    = errors.New("conflict")
	ErrNotFound    = errors.New("not found")
	ErrUnavailable = errors.New("unavailable")
)

func conflict(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrConflict, fmt.Sprintf(format, args...))
}

func notFound(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrNotFound, fmt.Sprintf(format, args...))
}

func unavailable(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUnavailable, fmt.Sprintf(format, args...))
}

// DefaultLaneWait is how long a Service waits, by default, for the dispatchers to
// describe their lanes.
const DefaultLaneWait = 300 * time.Millisecond

// Config is what a Service works with.
type Config struct {
	// Queue and Control are the queue and its control bucket; both are required.
	Queue   *queue.Queue
	Control *queue.Control
	// Log hears of every change an operator makes.
	Log zerolog.Logger
	// Registerer, if not nil, gets the dispatch_replayed_total counter.
	Registerer prometheus.Registerer
	// LaneWait is how long to wait for the dispatchers to describe their lanes; the
	// answers that arrive later are left out. Defaults to DefaultLaneWait.
	LaneWait time.Duration
	// Interval is the configured DISPATCH_INTERVAL of the dispatcher serving the API,
	// shown with the steering; zero where there is none (dispatchctl).
	Interval time.Duration
	// Instance names this process in the events it writes (a replay's).
	Instance string
	// Tracing, if not nil, records each replay of a dead letter as a span that links to
	// the request's original trace; the attempts after it are its children.
	Tracing trace.TracerProvider
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.LaneWait == 0 {
		c.LaneWait = DefaultLaneWait
	}
	return c
}

// Validate reports the fields that cannot work, and what they accept.
func (c Config) Validate() error {
	var errs []error
	if c.Queue == nil || c.Control == nil {
		errs = append(errs, errors.New("admin: the queue and its control bucket are required"))
	}
	if c.LaneWait <= 0 || c.LaneWait > 10*time.Second {
		errs = append(errs, fmt.Errorf("admin: lane wait %s: must be more than 0 and at most 10s", c.LaneWait))
	}
	return errors.Join(errs...)
}

// Service runs operators' commands against one queue.
type Service struct {
	q        *queue.Queue
	ctl      *queue.Control
	log      zerolog.Logger
	laneWait time.Duration
	interval time.Duration
	instance string
	replayed prometheus.Counter // nil: not counted
	// refused counts calls with a wrong or missing token (nil: not counted)
	refused prometheus.Counter
	// oldestRead is the most requests the oldest-first page reads in the queue's order
	// before it reads every client's head instead.
	oldestRead int
	tracer     trace.Tracer // nil: tracing is off
	aliveCache
	backlogCache
}

// New returns a Service for cfg, with its defaults filled in.
func New(cfg Config) (*Service, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Service{q: cfg.Queue, ctl: cfg.Control, log: cfg.Log.With().Str("component", "admin").Logger(), laneWait: cfg.LaneWait, interval: cfg.Interval, instance: cfg.Instance, oldestRead: oldestRead}
	if cfg.Tracing != nil {
		s.tracer = cfg.Tracing.Tracer(tracing.Name)
	}
	if cfg.Registerer != nil {
		s.replayed = prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dispatch_replayed_total",
			Help: "Dead letters put back in their client's queue by a replay through this process.",
		})
		s.refused = prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dispatch_admin_refused_total",
			Help: "Admin API calls refused for a missing or wrong token (401, or 429 past the wrong tokens' throttle).",
		})
		for _, c := range []prometheus.Collector{s.replayed, s.refused} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("admin: %w", err)
			}
		}
	}
	return s, nil
}
