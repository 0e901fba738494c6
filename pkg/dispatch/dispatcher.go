package dispatch

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/penguinhq/dispatcher/pkg/governor"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/tracing"
)

// Dispatcher sends queued requests to raven, client by client, spaced by the interval.
type Dispatcher struct {
	cfg  Config
	src  Source
	snd  Sender
	log  zerolog.Logger
	now  clock          // time.Now; tests set their own
	rand func() float64 // jitter of retry backoff; tests set their own

	lanes, inFlight, owned atomic.Int64
	overdue, lapsed        atomic.Int64 // counted every second by the loop
	running                atomic.Bool
	queries                chan laneQuery
	owns                   chan ownAsk // cancels asking the loop about a partition
	cancelsDone            chan int    // cancels letting go of their partition
	sending                *sending    // keeps cancels and attempts of one request apart
	recent                 *recent
	activity               *activity
	gov                    *governor.Governor
	tracer                 trace.Tracer // nil: tracing is off
}

// Stats is a snapshot of a running Dispatcher.
type Stats struct {
	Lanes    int // clients with a backlog held in memory
	InFlight int // attempts in flight
	Owned    int // partitions owned
	// Overdue are lanes due for longer than OverdueAfter intervals with no attempt
	// started: a stall, unless raven's budget holds them back.
	Overdue int
	// Lapsed are partitions this instance holds whose lease could have lapsed by its own
	// clock: it starts no attempt there until a renewal lands (or lets them go).
	Lapsed int
}

// Stats returns how much the dispatcher holds now; safe to call from any goroutine.
func (d *Dispatcher) Stats() Stats {
	return Stats{Lanes: int(d.lanes.Load()), InFlight: int(d.inFlight.Load()), Owned: int(d.owned.Load()),
		Overdue: int(d.overdue.Load()), Lapsed: int(d.lapsed.Load())}
}

// New returns a Dispatcher.
func New(cfg Config, src Source, snd Sender, log zerolog.Logger) (*Dispatcher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log = log.With().Str("component", "dispatch").Str("instance", cfg.InstanceID).Logger()
	d := &Dispatcher{cfg: cfg, src: src, snd: snd, log: log, now: time.Now, rand: rand.Float64,
		queries: make(chan laneQuery), owns: make(chan ownAsk), cancelsDone: make(chan int), sending: newSending(), recent: newRecent(cfg.RecentDeliveries), activity: newActivity(cfg.AttemptHistory)}
	var gm governor.Metrics // a nil *Metrics in it would not be nil
	if cfg.Metrics != nil {
		gm = cfg.Metrics
	}
	d.gov = governor.New(cfg.Budget, cfg.Adaptive, src.Partitions(), gm, log)
	if cfg.Tracing != nil {
		d.tracer = cfg.Tracing.Tracer(tracing.Name)
	}
	cfg.Metrics.watch(d)
	return d, nil
}

// Running says whether Run is dispatching: it has its steering and watch in place and
// has not begun to stop.
func (d *Dispatcher) Running() bool { return d.running.Load() }

// Run dispatches until ctx is done, then lets attempts in flight finish within
// ShutdownGrace, hands its leases back and returns.
//
// A partition becomes this instance's either at start (without Leases) or when a lease
// is acquired; either way the first attempt there waits one full interval, since an
// attempt by whoever sent there before (a crashed process, another instance) may have
// ended only just now.
func (d *Dispatcher) Run(ctx context.Context) error {
	l := newLoop(d, ctx)
	defer l.stopWork()
	// Steering first: a client given a longer interval must have it before any fence is
	// worked out.
	stopSteering, err := l.watchSteering(ctx)
	if err != nil {
		return err
	}
	defer stopSteering()
	if st := d.BudgetState(); st.Limited() {
		d.log.Info().Str("rate", request.FormatRate(st.MaxRate)).Str("in_flight", request.FormatInFlight(st.MaxInFlight)).
			Bool("adaptive", st.Adaptive).Bool("steered", st.Steered != nil).Msg("raven's budget in force, each instance holding to its share")
	}
	// The backlog is watched and listed off the loop, both feeding the loop's notes, so
	// that neither a slow queue nor a long listing holds up sends that are due.
	watchDone := make(chan struct{})
	go l.keepWatch(ctx, watchDone)
	go l.lister(ctx)
	leaserDone, releaseAll := l.own(ctx)

	d.running.Store(true)
	defer d.running.Store(false)
	l.serve(ctx)

	d.running.Store(false)
	l.drain()
	<-watchDone // its consumer deleted, not left on the server
	<-leaserDone
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	releaseAll(rctx)
	return nil
}

// BudgetState is this instance's view of raven's budget; safe from any goroutine.
func (d *Dispatcher) BudgetState() governor.BudgetState {
	st := d.gov.Published()
	st.InFlight = int(d.inFlight.Load())
	return st
}
