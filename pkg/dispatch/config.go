package dispatch

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/governor"
	"github.com/penguinhq/dispatcher/pkg/lease"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// Defaults for Config.
const (
	DefaultMaxInFlight   = 1024
	DefaultShutdownGrace = 15 * time.Second
	DefaultResyncEvery   = 30 * time.Second
	DefaultLeaseTTL      = 30 * time.Second
	DefaultSendTimeout   = 10 * time.Second // the raven client's default timeout
)

// Config configures a Dispatcher.
type Config struct {
	schedule.Policy
	// MaxInFlight caps attempts in flight at once, across all clients. Defaults to 1024.
	MaxInFlight int
	// ShutdownGrace bounds how long Run waits for attempts in flight when it is stopped.
	// Defaults to 15s.
	ShutdownGrace time.Duration
	// ResyncEvery is how often the backlog of owned partitions is listed again, as a
	// safety net behind the watch. Defaults to 30s.
	ResyncEvery time.Duration
	// SendTimeout is the longest one attempt can take (the raven client's timeout). With
	// Leases, it sets how long before a lease could lapse sends stop. Defaults to 10s.
	SendTimeout time.Duration

	// Leases shares the partitions with other dispatcher instances. Nil means this
	// instance owns every partition: only one dispatcher may then run against the queue.
	Leases lease.Store
	// LeaseTTL is how long a lease lives unless renewed; a crashed instance's partitions
	// are taken over after about LeaseTTL plus one interval. It must exceed SendTimeout
	// comfortably. Defaults to 30s.
	LeaseTTL time.Duration
	// InstanceID names this instance in the lease store, in its logs, to operators and
	// to raven (User-Agent); it must be unique among live instances. Defaults to the host
	// name and a random suffix (DefaultInstanceID).
	InstanceID string

	// Budget limits attempts to raven across all instances (each holds itself to its
	// share); operators can change it through Steering. The zero Budget is no limit.
	Budget governor.Budget
	// Adaptive makes the rate to raven follow raven's answers (off unless Enabled).
	Adaptive governor.Adaptive

	// Steering brings operators' changes (intervals, pause, purge) while running. Nil
	// means none: the Policy holds.
	Steering SteeringSource
	// Metrics, if not nil, counts what the dispatcher does.
	Metrics *Metrics
	// Events, if not nil, hears each request's outcomes: attempts started and failed,
	// delivered, dead-lettered, purged.
	Events Events
	// Attempts, if not nil, is read for the attempts an earlier owner of a client made of
	// the request at its head, before the first attempt of it after a takeover or a
	// restart: MaxAttempts and MaxAge count them. Nil: a takeover counts from one again.
	Attempts AttemptRecord
	// Tracing, if not nil, records each attempt as a span of its request's trace (the
	// context ingest stored with it) and sends raven the attempt's traceparent.
	Tracing trace.TracerProvider
	// RecentDeliveries is how many deliveries are remembered by id for operators
	// (Delivered); about 150 bytes each. Negative remembers none. Defaults to 10000.
	RecentDeliveries int
	// AttemptHistory is how many clients' last HistoryPerClient attempts are remembered
	// for the console's gap chart, the most recently sent to kept; about 4 KB each.
	// Negative remembers none. Defaults to DefaultAttemptHistory.
	AttemptHistory int
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Policy = c.Policy.WithDefaults()
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = DefaultShutdownGrace
	}
	if c.ResyncEvery == 0 {
		c.ResyncEvery = DefaultResyncEvery
	}
	if c.SendTimeout == 0 {
		c.SendTimeout = DefaultSendTimeout
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	c.Adaptive = c.Adaptive.WithDefaults(c.SendTimeout)
	if c.InstanceID == "" {
		c.InstanceID = DefaultInstanceID()
	}
	if c.RecentDeliveries == 0 {
		c.RecentDeliveries = DefaultRecentDeliveries
	}
	if c.AttemptHistory == 0 {
		c.AttemptHistory = DefaultAttemptHistory
	}
	return c
}

// leaseMargin is how long before a lease could lapse this instance stops starting sends:
// the longest attempt, plus a tenth of the TTL for the time a renewal takes to be stored.
func (c Config) leaseMargin() time.Duration { return c.SendTimeout + c.LeaseTTL/10 }

// leaseEvery is how often leases are renewed: three times within the part of the TTL in
// which sends may start.
func (c Config) leaseEvery() time.Duration { return (c.LeaseTTL - c.leaseMargin()) / 3 }

// leasing is the leaser's configuration, over partitions partitions, on the clock now.
func (c Config) leasing(partitions int, now clock, log zerolog.Logger) lease.Config {
	return lease.Config{Store: c.Leases, ID: c.InstanceID, Partitions: partitions, TTL: c.LeaseTTL,
		Margin: c.leaseMargin(), Every: c.leaseEvery(), Now: now, Log: log}
}

// TakeoverBound is the longest a partition's clients wait for their next send after the
// instance that owned it crashed: its lease expires LeaseTTL after its last renewal,
// which may have come just before the crash; another instance sees the partition free at
// its next renewal round (leaseEvery); and it sends there one interval after taking it.
// An instance whose lease watch has run for less than a TTL (just started, or the watch
// broke) sends no sooner than a TTL after the watch began (renewals before it went
// unseen), unless the lease store had never been written to. With the defaults: 30 s +
// 5.7 s + 5 s = 40.7 s.
func (c Config) TakeoverBound() time.Duration { return c.LeaseTTL + c.leaseEvery() + c.Interval }

// Validate reports every field that cannot work.
func (c Config) Validate() error {
	errs := []error{c.Policy.Validate()}
	if c.MaxInFlight < 1 {
		errs = append(errs, fmt.Errorf("max in flight %d: must be at least 1", c.MaxInFlight))
	}
	if c.ShutdownGrace < 0 || c.ResyncEvery <= 0 {
		errs = append(errs, fmt.Errorf("shutdown grace %s and resync %s: must not be negative", c.ShutdownGrace, c.ResyncEvery))
	}
	errs = append(errs, c.Budget.Validate(), c.Adaptive.Validate())
	if err := ValidInstanceID(c.InstanceID); err != nil {
		errs = append(errs, err)
	}
	if c.Leases != nil && c.leaseEvery() < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("lease TTL %s: must be well over the send timeout %s (at least %s)",
			c.LeaseTTL, c.SendTimeout, (c.SendTimeout+30*time.Millisecond)*10/9))
	}
	return errors.Join(errs...)
}

// DefaultInstanceID is the host name with a random suffix: unique among instances, and
// a restarted process gets a new one (so it waits for its old leases like anyone else).
func DefaultInstanceID() string {
	host, _ := os.Hostname()
	return instanceIDOf(host, request.NewID(time.Now())[16:])
}

// instanceIDOf is host (made valid, and cut to leave room) with suffix.
func instanceIDOf(host, suffix string) string {
	host = invalidIDChars.ReplaceAllString(host, "-")
	if room := 64 - 1 - len(suffix); len(host) > room {
		host = host[:room]
	}
	return strings.TrimLeft(host+"-"+suffix, "-")
}

// ValidInstanceID says whether id can name an instance: a lease bucket key token.
func ValidInstanceID(id string) error {
	if !validID.MatchString(id) {
		return fmt.Errorf("instance id %q: it takes letters, digits and - _ = up to 64 characters", id)
	}
	return nil
}

var (
	validID        = regexp.MustCompile(`^[A-Za-z0-9_=-]{1,64}$`)
	invalidIDChars = regexp.MustCompile(`[^A-Za-z0-9_=-]+`)
)
