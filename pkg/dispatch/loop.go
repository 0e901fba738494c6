package dispatch

import (
	"context"
	"time"

	"github.com/penguinhq/dispatcher/pkg/lease"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// prefetchLead is how long before an attempt is due its head request is read.
const prefetchLead = 50 * time.Millisecond

// loop is the state of one Run. Only the goroutine running serve touches its maps and
// the scheduler; the lister goroutine and the workers reach it through channels only.
type loop struct {
	d           *Dispatcher
	sched       *schedule.Scheduler
	owned       map[int]*partition
	releasing   bool              // a hand-back waits for attempts in flight to come within the budget's share
	cancelsHeld int               // cancels holding a partition (holdForCancel)
	notes       chan request.Lane // lanes with (perhaps) new requests: watch and lister
	results     chan finished     // finished attempts: workers
	listReq     chan int          // partitions to list: to the lister
	steers      chan request.SteerChange
	events      chan lease.Event // the leaser's
	resync      chan struct{}
	watch       *watchPlan         // the partitions the backlog watch should cover: to keepWatch
	ctx         context.Context    // Run's: ends when it is asked to stop
	workCtx     context.Context    // attempts': outlives ctx by the shutdown grace
	stopWork    context.CancelFunc // ends workCtx
}

type finished struct {
	schedule.Result
	partition int
	token     bool // the attempt took a token of raven's budget
}

func newLoop(d *Dispatcher, ctx context.Context) *loop {
	l := &loop{
		d:       d,
		sched:   schedule.New(d.cfg.Policy, d.rand),
		owned:   make(map[int]*partition),
		notes:   make(chan request.Lane, 1<<16),
		results: make(chan finished, d.cfg.MaxInFlight),
		listReq: make(chan int, 4096),
		steers:  make(chan request.SteerChange, 1024),
		events:  make(chan lease.Event, d.src.Partitions()*2+16),
		resync:  make(chan struct{}, 1),
		watch:   newWatchPlan(),
		ctx:     ctx,
	}
	l.workCtx, l.stopWork = context.WithCancel(context.WithoutCancel(ctx))
	// Read head requests a little ahead of time, so that the queue's latency (an fsync
	// in progress, say) does not delay the attempt past its due time.
	l.sched.SetLead(min(prefetchLead, d.cfg.Interval/2))
	return l
}

// watchSteering applies the steering in force, and passes later changes to the loop.
func (l *loop) watchSteering(ctx context.Context) (stop func(), err error) {
	if l.d.cfg.Steering == nil {
		return func() {}, nil
	}
	current, stop, err := l.d.cfg.Steering.WatchSteering(ctx, func(c request.SteerChange) {
		select {
		case l.steers <- c:
		case <-ctx.Done():
		}
	})
	if err != nil {
		return nil, err
	}
	clients := 0
	for _, c := range current {
		l.steer(c, true)
		if c.Client != "" && !c.Steering.IsZero() {
			clients++
		}
	}
	if len(current) > 0 {
		l.d.log.Info().Stringer("interval", l.sched.Interval()).Int("steered_clients", clients).Msg("steering in force")
	}
	return stop, nil
}

func (l *loop) askResync() {
	select {
	case l.resync <- struct{}{}:
	default:
	}
}

// own makes partitions this instance's: every one at once without Leases, else through
// a leaser. It returns a channel closed once the leaser has stopped (at once without
// one), and what hands the leases back.
func (l *loop) own(ctx context.Context) (leaserDone <-chan struct{}, releaseAll func(context.Context)) {
	d := l.d
	done := make(chan struct{})
	if d.cfg.Leases == nil {
		close(done)
		now := d.now()
		for p := range d.src.Partitions() {
			l.take(p, now, time.Time{}, time.Time{})
		}
		d.log.Info().Int("partitions", d.src.Partitions()).Stringer("fence", l.sched.Interval()).Msg("dispatcher owns every partition; first sends wait one interval")
		return done, func(context.Context) {}
	}
	lm := lease.New(d.cfg.leasing(d.src.Partitions(), d.now, d.log), l.events)
	lctx, cancel := context.WithCancel(ctx)
	go func() { defer close(done); defer cancel(); lm.Run(lctx) }()
	d.log.Info().Stringer("lease_ttl", d.cfg.LeaseTTL).Stringer("renew_every", d.cfg.leaseEvery()).Msg("dispatcher sharing partitions through leases")
	return done, lm.ReleaseAll
}

// serve runs the loop until ctx ends: it starts what is due, then waits for the next
// thing to happen.
func (l *loop) serve(ctx context.Context) {
	d := l.d
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	ticker := time.NewTicker(d.cfg.ResyncEvery)
	defer ticker.Stop()
	counts := time.NewTicker(time.Second)
	defer counts.Stop()
	for {
		l.startDue()
		d.lanes.Store(int64(l.sched.Lanes()))
		d.inFlight.Store(int64(l.sched.InFlight()))
		d.owned.Store(int64(len(l.owned)))
		// Wake when the next lane is due, and not before raven's budget lets one go: a
		// budget held back for attempts in flight waits for their results instead.
		next, ok := l.sched.Next()
		held, wake := l.d.gov.HeldBack()
		if ok && l.sched.InFlight() < d.cfg.MaxInFlight && (!held || !wake.IsZero()) {
			timer.Reset(max(schedule.Later(next, wake).Sub(d.now()), 0))
		} else {
			timer.Stop()
		}
		select {
		case <-ctx.Done():
			return
		case lane := <-l.notes:
			l.notifyAll(lane)
		case r := <-l.results:
			l.done(r)
		case e := <-l.events:
			l.ownership(e)
		case c := <-l.steers:
			l.steer(c, false)
		case q := <-d.queries:
			q.reply <- l.lanesOf(q)
		case q := <-d.owns:
			q.reply <- l.holdForCancel(q.lane)
		case h := <-d.cancelsDone:
			l.cancelDone(h)
		case <-timer.C:
		case <-ticker.C:
			l.askResync()
		case <-counts.C:
			l.countStalls()
		case <-l.resync:
			l.listOpen()
		}
	}
}

// countStalls counts the lanes overdue and the partitions held with a lapsed lease, for
// the metrics.
func (l *loop) countStalls() {
	now := l.d.now()
	l.d.overdue.Store(int64(l.sched.Overdue(now)))
	n := 0
	for _, part := range l.owned {
		if part.open() && lapsed(part.validUntil, now) {
			n++
		}
	}
	l.d.lapsed.Store(int64(n))
}

// notifyAll takes lane and whatever else has arrived, without a trip around the loop.
func (l *loop) notifyAll(lane request.Lane) {
	l.notify(lane)
	for {
		select {
		case lane := <-l.notes:
			l.notify(lane)
		default:
			return
		}
	}
}

// lister lists the backlog of each partition asked for and feeds it into notes.
func (l *loop) lister(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-l.listReq:
			backlog, err := l.d.src.PartitionBacklog(ctx, p)
			if err != nil {
				if ctx.Err() == nil {
					l.d.log.Warn().Err(err).Int("partition", p).Msg("listing backlog failed; will retry")
					time.AfterFunc(time.Second, func() {
						select {
						case l.listReq <- p:
						default:
						}
					})
				}
				continue
			}
			for lane := range backlog {
				select {
				case l.notes <- lane:
				case <-ctx.Done():
					return
				}
			}
		}
	}
}

// drain waits for the attempts in flight, up to the shutdown grace, then cancels them;
// and for the cancels that hold a partition, each bounded by its own deadline (the
// lease, or its caller's), so that no lease is released while one may still remove.
func (l *loop) drain() {
	if l.sched.InFlight() == 0 && l.cancelsHeld == 0 {
		return
	}
	l.d.log.Info().Int("in_flight", l.sched.InFlight()).Int("cancels", l.cancelsHeld).Stringer("grace", l.d.cfg.ShutdownGrace).Msg("draining attempts in flight")
	grace := time.NewTimer(l.d.cfg.ShutdownGrace)
	defer grace.Stop()
	for l.sched.InFlight() > 0 || l.cancelsHeld > 0 {
		select {
		case r := <-l.results:
			l.done(r)
		case h := <-l.d.cancelsDone:
			l.cancelDone(h)
		case <-grace.C:
			l.d.log.Warn().Int("in_flight", l.sched.InFlight()).Msg("shutdown grace over; cancelling attempts in flight")
			l.stopWork()
		}
	}
}

// steer applies one steering change. A change is logged once, with who made it, on
// every dispatcher that applies it; the steering found in force at start is summed up
// by watchSteering instead, and a record that steers as before (seen again when a watch
// restarts, or a cleared record deleted after it was written) is not logged.
func (l *loop) steer(c request.SteerChange, quiet bool) {
	if c.Budget != nil {
		was, is := l.d.gov.Steer(*c.Budget, l.d.now())
		if was != is && !quiet {
			l.d.log.Info().Str("was", was.Describe()).Str("now", is.Describe()).Str("by", c.Budget.By).
				Msg("raven's budget changed")
		}
		return
	}
	if c.Client == "" {
		iv := time.Duration(c.Steering.Interval)
		if iv <= 0 {
			iv = l.d.cfg.Interval
		}
		if iv != l.sched.Interval() && !quiet {
			l.d.log.Info().Stringer("interval", iv).Bool("configured", c.Steering.Interval <= 0).Str("by", c.Steering.By).
				Msg("global interval changed")
		}
		l.sched.SetInterval(iv, l.d.now())
		return
	}
	if old := l.sched.SteeringOf(c.Client); !old.Same(c.Steering) && !quiet {
		id, _ := request.DecodeClientID(c.Client)
		l.d.log.Info().Str("client_id", id).Str("by", c.Steering.By).Str("was", old.String()).Str("now", c.Steering.String()).
			Msg("client steering changed")
	}
	l.sched.Steer(c.Client, c.Steering, l.d.now())
}
