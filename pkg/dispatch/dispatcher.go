package dispatch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Source is the queue as the dispatcher sees it.
type Source interface {
	// Partitions is how many partitions client subjects are spread over.
	Partitions() int
	// PartitionOf returns the partition of a request subject.
	PartitionOf(subject string) (int, error)
	// PartitionBacklog lists the subjects of partition p that have requests queued.
	PartitionBacklog(ctx context.Context, p int) (map[string]uint64, error)
	// Watch calls fn with the subject of each request stored from now on; onErr hears of
	// trouble after which a backlog listing is due.
	Watch(ctx context.Context, fn func(subject string), onErr func(error)) (stop func(), err error)
	// Head reads the oldest request on subject; ok is false when there is none.
	Head(ctx context.Context, subject string) (st request.Stored, ok bool, err error)
	// Delete removes a request; one already gone is not an error.
	Delete(ctx context.Context, seq uint64) error
	// DeadLetter writes a request to the dead-letter stream (it stays in the queue).
	DeadLetter(ctx context.Context, st request.Stored, why request.DeadLetter) error
}

// SteerChange is one change of steering: the global interval when Client is empty (an
// Interval of zero restores the configured one), else one client's Steer (Client is the
// client's subject token).
type SteerChange struct {
	Client string
	Steer  Steer
}

// Steering is where operators' steering comes from, shared by every instance.
type Steering interface {
	// WatchSteering returns the steering in force now, then calls fn with every later
	// change until stopped.
	WatchSteering(ctx context.Context, fn func(SteerChange)) (current []SteerChange, stop func(), err error)
}

// Sender makes one attempt of a request. It returns nil when raven accepted it. An error
// with a method Permanent() bool that returns true is not retried; one with RetryAfter()
// time.Duration delays the retry; StatusCode() int, if present, is recorded.
type Sender interface {
	Send(ctx context.Context, st request.Stored, attempt int) error
}

// Defaults for Config.
const (
	DefaultMaxInFlight   = 1024
	DefaultShutdownGrace = 15 * time.Second
	DefaultResyncEvery   = 30 * time.Second
	DefaultLeaseTTL      = 30 * time.Second
	DefaultSendTimeout   = 10 * time.Second // the raven client's default timeout
)

// prefetchLead is how long before an attempt is due its head request is read.
const prefetchLead = 50 * time.Millisecond

// Config configures a Dispatcher.
type Config struct {
	Policy
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
	Leases LeaseStore
	// LeaseTTL is how long a lease lives unless renewed; a crashed instance's partitions
	// are taken over after about LeaseTTL plus one interval. It must exceed SendTimeout
	// comfortably. Defaults to 30s.
	LeaseTTL time.Duration
	// InstanceID names this instance in the lease store; it must be unique among live
	// instances. Defaults to a random id.
	InstanceID string

	// Steering brings operators' changes (intervals, pause, purge) while running. Nil
	// means none: the Policy holds.
	Steering Steering
	// Metrics, if not nil, counts what the dispatcher does.
	Metrics *Metrics
	// RecentDeliveries is how many deliveries are remembered by id for operators
	// (Delivered); about 150 bytes each. Negative remembers none. Defaults to 10000.
	RecentDeliveries int
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
	if c.InstanceID == "" {
		c.InstanceID = request.NewID(time.Now())
	}
	if c.RecentDeliveries == 0 {
		c.RecentDeliveries = DefaultRecentDeliveries
	}
	return c
}

// leaseMargin is how long before a lease could lapse this instance stops starting sends:
// the longest attempt, plus a tenth of the TTL for the time a renewal takes to be stored.
func (c Config) leaseMargin() time.Duration { return c.SendTimeout + c.LeaseTTL/10 }

// leaseEvery is how often leases are renewed: three times within the part of the TTL in
// which sends may start.
func (c Config) leaseEvery() time.Duration { return (c.LeaseTTL - c.leaseMargin()) / 3 }

// Validate reports every field that cannot work.
func (c Config) Validate() error {
	errs := []error{c.Policy.Validate()}
	if c.MaxInFlight < 1 {
		errs = append(errs, fmt.Errorf("max in flight %d: must be at least 1", c.MaxInFlight))
	}
	if c.ShutdownGrace < 0 || c.ResyncEvery <= 0 {
		errs = append(errs, fmt.Errorf("shutdown grace %s and resync %s: must not be negative", c.ShutdownGrace, c.ResyncEvery))
	}
	if c.Leases != nil && c.leaseEvery() < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("lease TTL %s: must be well over the send timeout %s (at least %s)",
			c.LeaseTTL, c.SendTimeout, (c.SendTimeout+30*time.Millisecond)*10/9))
	}
	return errors.Join(errs...)
}

// Dispatcher sends queued requests to raven, client by client, spaced by the interval.
type Dispatcher struct {
	cfg  Config
	src  Source
	snd  Sender
	log  zerolog.Logger
	now  func() time.Time
	rand func() float64

	lanes, inFlight, owned atomic.Int64
	running                atomic.Bool
	queries                chan laneQuery
	recent                 *recent
}

// Stats is a snapshot of a running Dispatcher.
type Stats struct {
	Lanes    int // clients with a backlog held in memory
	InFlight int // attempts in flight
	Owned    int // partitions owned
}

// Stats returns how much the dispatcher holds now; safe to call from any goroutine.
func (d *Dispatcher) Stats() Stats {
	return Stats{Lanes: int(d.lanes.Load()), InFlight: int(d.inFlight.Load()), Owned: int(d.owned.Load())}
}

// New returns a Dispatcher.
func New(cfg Config, src Source, snd Sender, log zerolog.Logger) (*Dispatcher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log = log.With().Str("component", "dispatch").Str("instance", cfg.InstanceID).Logger()
	d := &Dispatcher{cfg: cfg, src: src, snd: snd, log: log, now: time.Now, rand: rand.Float64,
		queries: make(chan laneQuery), recent: newRecent(cfg.RecentDeliveries)}
	cfg.Metrics.watch(d)
	return d, nil
}

// Running says whether Run is dispatching: it has its steering and watch in place and
// has not begun to stop.
func (d *Dispatcher) Running() bool { return d.running.Load() }

// partition is what the loop knows of one partition it owns.
type partition struct {
	since      time.Time // when it became ours: no attempt starts before an interval after
	validUntil time.Time // no attempt starts after this (the lease could lapse)
	inFlight   int
	release    chan struct{} // closed once drained, when handing the partition back
	gone       bool          // the lease was lost; kept only until attempts in flight end
}

// open says whether new attempts may start in the partition.
func (p *partition) open() bool { return p != nil && p.release == nil && !p.gone }

// loop is the state of one Run; only Run's goroutine touches it.
type loop struct {
	d       *Dispatcher
	sched   *Scheduler
	owned   map[int]*partition
	notes   chan string
	results chan outcome
	listReq chan int // partitions to list
	ctx     context.Context
}

type outcome struct {
	Result
	partition int
}

// Run dispatches until ctx is done, then lets attempts in flight finish within
// ShutdownGrace, hands its leases back and returns.
//
// A partition becomes this instance's either at start (without Leases) or when a lease
// is acquired; either way the first attempt there waits one full interval, since an
// attempt by whoever sent there before (a crashed process, another instance) may have
// ended only just now.
func (d *Dispatcher) Run(ctx context.Context) error {
	l := &loop{
		d:       d,
		sched:   NewScheduler(d.cfg.Policy, d.rand),
		owned:   make(map[int]*partition),
		notes:   make(chan string, 1<<16),
		results: make(chan outcome, d.cfg.MaxInFlight),
		listReq: make(chan int, 4096),
		ctx:     ctx,
	}
	// Read head requests a little ahead of time, so that the queue's latency (an fsync
	// in progress, say) does not delay the attempt past its due time.
	l.sched.SetLead(min(prefetchLead, d.cfg.Interval/2))

	// Steering first: a client given a longer interval must have it before any fence is
	// worked out.
	steers := make(chan SteerChange, 1024)
	if d.cfg.Steering != nil {
		current, stopSteering, err := d.cfg.Steering.WatchSteering(ctx, func(c SteerChange) {
			select {
			case steers <- c:
			case <-ctx.Done():
			}
		})
		if err != nil {
			return err
		}
		defer stopSteering()
		for _, c := range current {
			l.steer(c)
		}
	}
	resync := make(chan struct{}, 1)
	askResync := func() {
		select {
		case resync <- struct{}{}:
		default:
		}
	}
	stopWatch, err := d.src.Watch(ctx, func(subj string) {
		select {
		case l.notes <- subj:
		case <-ctx.Done():
		}
	}, func(err error) {
		d.log.Warn().Err(err).Msg("backlog watch trouble; listing the backlog again")
		askResync()
	})
	if err != nil {
		return err
	}
	defer stopWatch()

	// The backlog is listed off the loop, feeding the same channel as the watch, so that a
	// long listing never holds up sends that are due.
	go l.lister(ctx)

	events := make(chan ownEvent, d.src.Partitions()*2+16)
	var lm *leaser
	leaserDone := make(chan struct{})
	if d.cfg.Leases == nil {
		close(leaserDone)
		now := d.now()
		for p := range d.src.Partitions() {
			l.acquire(p, now, time.Time{}, time.Time{})
		}
		d.log.Info().Int("partitions", d.src.Partitions()).Stringer("fence", l.sched.Interval()).Msg("dispatcher owns every partition; first sends wait one interval")
	} else {
		lm = &leaser{store: d.cfg.Leases, id: d.cfg.InstanceID, partitions: d.src.Partitions(),
			ttl: d.cfg.LeaseTTL, margin: d.cfg.leaseMargin(), every: d.cfg.leaseEvery(),
			events: events, log: d.log, held: map[int]*holding{}, drained: make(chan drained, d.src.Partitions()),
			seen: map[int]time.Time{}}
		lctx, cancelLeaser := context.WithCancel(ctx)
		defer cancelLeaser()
		go func() { defer close(leaserDone); lm.run(lctx) }()
		d.log.Info().Stringer("lease_ttl", d.cfg.LeaseTTL).Stringer("renew_every", d.cfg.leaseEvery()).Msg("dispatcher sharing partitions through leases")
	}

	// Attempts run on a context that outlives ctx by the shutdown grace.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	ticker := time.NewTicker(d.cfg.ResyncEvery)
	defer ticker.Stop()

	d.running.Store(true)
	defer d.running.Store(false)
	for {
		l.startDue(workCtx)
		d.lanes.Store(int64(l.sched.Lanes()))
		d.inFlight.Store(int64(l.sched.InFlight()))
		d.owned.Store(int64(len(l.owned)))
		if next, ok := l.sched.Next(); ok && l.sched.InFlight() < d.cfg.MaxInFlight {
			timer.Reset(max(next.Sub(d.now()), 0))
		} else {
			timer.Stop()
		}
		select {
		case <-ctx.Done():
			d.running.Store(false)
			l.drain(cancelWork)
			<-leaserDone
			if lm != nil {
				rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				lm.releaseAll(rctx)
				cancel()
			}
			return nil
		case subj := <-l.notes:
			l.notify(subj)
			for more := true; more; { // take what else arrived without a trip around the loop
				select {
				case subj := <-l.notes:
					l.notify(subj)
				default:
					more = false
				}
			}
		case r := <-l.results:
			l.done(r)
		case e := <-events:
			l.ownership(e)
		case c := <-steers:
			l.steer(c)
		case q := <-d.queries:
			q.reply <- l.lanesOf(q)
		case <-timer.C:
		case <-ticker.C:
			askResync()
		case <-resync:
			for p, part := range l.owned {
				if part.open() {
					l.list(p)
				}
			}
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
			for subj := range backlog {
				select {
				case l.notes <- subj:
				case <-ctx.Done():
					return
				}
			}
		}
	}
}

// acquire makes partition p ours from now, or from notBefore if that is later (see the
// leaser's fencing); the scheduler adds the interval.
func (l *loop) acquire(p int, now, validUntil, notBefore time.Time) {
	part := &partition{since: later(now, notBefore), validUntil: validUntil}
	if old := l.owned[p]; old != nil {
		part.inFlight = old.inFlight // results of an earlier tenure still on their way
	}
	l.owned[p] = part
	l.list(p)
}

// list asks the lister for partition p's backlog without ever blocking the loop.
func (l *loop) list(p int) {
	select {
	case l.listReq <- p:
	default:
		go func() {
			select {
			case l.listReq <- p:
			case <-l.ctx.Done():
			}
		}()
	}
}

func (l *loop) ownership(e ownEvent) {
	now := l.d.now()
	part := l.owned[e.partition]
	switch e.kind {
	case ownAcquired:
		l.acquire(e.partition, now, e.validUntil, e.notBefore)
	case ownRenewed:
		if part != nil {
			part.validUntil = e.validUntil
		}
	case ownLost:
		l.forget(e.partition)
		if part != nil {
			part.gone = true
			if part.inFlight == 0 {
				if part.release != nil {
					close(part.release)
				}
				delete(l.owned, e.partition)
			}
		}
	case ownRelease:
		if part == nil {
			close(e.done)
			return
		}
		part.release = e.done
		l.forget(e.partition)
		if part.inFlight == 0 {
			close(part.release)
			delete(l.owned, e.partition)
		}
	}
}

// forget drops the waiting lanes of partition p; lanes in flight are dropped as they end.
func (l *loop) forget(p int) {
	l.sched.ForgetWaiting(func(subj string) bool {
		q, err := l.d.src.PartitionOf(subj)
		return err == nil && q == p
	})
}

// owner returns subject's partition and its state, the state only if attempts may start
// there.
func (l *loop) owner(subj string) (int, *partition) {
	p, err := l.d.src.PartitionOf(subj)
	if err != nil {
		return -1, nil
	}
	if part := l.owned[p]; part.open() {
		return p, part
	}
	return p, nil
}

func (l *loop) notify(subj string) {
	if _, part := l.owner(subj); part != nil {
		l.sched.Notify(subj, l.d.now(), part.since)
	}
}

func (l *loop) startDue(workCtx context.Context) {
	now := l.d.now()
	for l.sched.InFlight() < l.d.cfg.MaxInFlight {
		job, ok := l.sched.Due(now)
		if !ok {
			return
		}
		p, part := l.owner(job.Subject)
		switch {
		case part == nil:
			l.sched.Forget(job.Subject)
		case job.Since.Before(part.since):
			// A lane that outlived an earlier holding of the partition: it waits out the
			// fence like a new one.
			l.sched.Hold(job.Subject, part.since)
		case !part.validUntil.IsZero() && !now.Before(part.validUntil):
			// The lease is not renewed yet: the same as a worker finding so.
			l.sched.Done(Result{Subject: job.Subject, Kind: Held}, now)
		default:
			part.inFlight++
			sendBy := part.validUntil // read here: the loop moves it on as leases are renewed
			go func() { l.results <- outcome{Result: l.d.work(workCtx, job, sendBy), partition: p} }()
		}
	}
}

func (l *loop) done(r outcome) {
	l.sched.Done(r.Result, l.d.now())
	part := l.owned[r.partition]
	if part != nil {
		part.inFlight--
	}
	if part.open() {
		return
	}
	l.sched.Forget(r.Subject)
	if part != nil && part.inFlight == 0 {
		if part.release != nil {
			close(part.release)
		}
		delete(l.owned, r.partition)
	}
}

func (l *loop) drain(cancelWork context.CancelFunc) {
	if l.sched.InFlight() == 0 {
		return
	}
	l.d.log.Info().Int("in_flight", l.sched.InFlight()).Stringer("grace", l.d.cfg.ShutdownGrace).Msg("draining attempts in flight")
	grace := time.NewTimer(l.d.cfg.ShutdownGrace)
	defer grace.Stop()
	for l.sched.InFlight() > 0 {
		select {
		case r := <-l.results:
			l.done(r)
		case <-grace.C:
			l.d.log.Warn().Int("in_flight", l.sched.InFlight()).Msg("shutdown grace over; cancelling attempts in flight")
			cancelWork()
		}
	}
}

// work looks at one client's head request and makes one attempt.
//
// sendBy is when the partition's lease could lapse (zero: never); an attempt that could
// not start by then is not made and the lane is held.
func (d *Dispatcher) work(ctx context.Context, job Job, sendBy time.Time) Result {
	res := Result{Subject: job.Subject}
	st, ok, err := d.src.Head(ctx, job.Subject)
	if errors.Is(err, request.ErrUndecodable) {
		d.log.Warn().Str("subject", job.Subject).Uint64("seq", st.Seq).Msg("message not written by ingest; dead-lettering it unsent")
		if d.finish(ctx, st, request.DeadLetter{Reason: request.ReasonUndecodable, LastError: err.Error()}) != nil {
			res.Kind = Failed
			return res
		}
		d.cfg.Metrics.deadLettered(request.ReasonUndecodable)
		res.Kind = DeadLettered
		return res
	}
	if err != nil {
		d.log.Debug().Err(err).Str("subject", job.Subject).Msg("reading head request failed; will look again")
		res.Kind = Failed
		return res
	}
	if !ok {
		res.Kind = Empty
		return res
	}
	if st.Seq <= job.PurgeThrough {
		// An operator purged the client's backlog up to here: dead-letter it unsent. No
		// attempt is made, so the lane's spacing is untouched. Like a send, it is only
		// started while the partition is surely ours.
		if !sendBy.IsZero() && !d.now().Before(sendBy) {
			res.Kind = Held
			return res
		}
		if d.finish(ctx, st, request.DeadLetter{Reason: request.ReasonPurged}) != nil {
			res.Kind = Failed
			return res
		}
		d.cfg.Metrics.deadLettered(request.ReasonPurged)
		d.log.Info().Str("client_id", st.ClientID).Str("request_id", st.ID).Msg("request purged to the dead-letter stream")
		res.Kind = DeadLettered
		return res
	}
	if job.Paused {
		res.Kind = Parked
		return res
	}
	// The head was read up to the scheduler's lead in advance: start on time, not before.
	if wait := job.SendAt.Sub(d.now()); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			res.Kind = Failed
			return res
		}
	}
	if !sendBy.IsZero() && !d.now().Before(sendBy) {
		res.Kind = Held
		return res
	}
	attempt, first := 1, time.Time{}
	if st.Seq == job.HeadSeq {
		attempt, first = job.Attempts+1, job.FirstAttempt
	}
	start := d.now()
	if first.IsZero() {
		first = start
	}
	err = d.snd.Send(ctx, st, attempt)
	end := d.now()
	res.AttemptEnd = end
	d.cfg.Metrics.attempt(start, end, job.PrevEnd, err)

	// Fields are added per event, not through a child logger: no allocation per attempt
	// when the level is off.
	about := func(ev *zerolog.Event) *zerolog.Event {
		return ev.Str("client_id", st.ClientID).Str("request_id", st.ID).Int("attempt", attempt)
	}
	if ev := d.log.Debug(); ev.Enabled() {
		if !job.PrevEnd.IsZero() {
			ev = ev.Int64("gap_ms", start.Sub(job.PrevEnd).Milliseconds())
		}
		about(ev).Dur("took", end.Sub(start)).Err(err).Msg("attempt")
	}

	why := request.DeadLetter{Attempts: attempt, FirstAttempt: first, LastAttempt: start, LastStatus: statusOf(err)}
	var perm interface{ Permanent() bool }
	switch {
	case err == nil:
		if d.remove(ctx, st, sendBy) != nil {
			res.Kind = Failed // shutting down; the request stays and is sent again later
			return res
		}
		d.recent.add(Delivery{ID: st.ID, Subject: st.Subject, Attempt: attempt, Delivered: end})
		d.log.Debug().Str("client_id", st.ClientID).Str("request_id", st.ID).Int("attempt", attempt).Msg("request delivered")
		d.cfg.Metrics.delivered()
		res.Kind = Delivered
		return res
	case errors.As(err, &perm) && perm.Permanent():
		why.Reason = request.ReasonPermanent
	default:
		if why.Reason = d.cfg.GiveUp(attempt, st.AcceptedAt, end); why.Reason == "" {
			var ra interface{ RetryAfter() time.Duration }
			if errors.As(err, &ra) {
				res.RetryAfter = ra.RetryAfter()
			}
			res.Kind, res.Seq, res.Attempts, res.FirstAttempt = Retry, st.Seq, attempt, first
			about(d.log.Info()).Err(err).Dur("retry_after", res.RetryAfter).Msg(LogAttemptFailed)
			return res
		}
	}
	if why.LastStatus == 0 {
		why.LastError = err.Error()
	}
	if d.finish(ctx, st, why) != nil {
		res.Kind = Failed
		return res
	}
	d.cfg.Metrics.deadLettered(why.Reason)
	about(d.log.Warn()).Str("reason", why.Reason).Int("last_status", why.LastStatus).Msg("request dead-lettered")
	res.Kind = DeadLettered
	return res
}

// LogRemovalFailed is the message of the log line, with the request's request_id, that
// says a delivered request could not be removed from the queue at once: until its removal
// lands, it may be sent again. LogRemovalLate says the removal landed, but only after the
// partition's lease could have lapsed (the process was paused, or the store slow), so
// that another instance may have sent it again meanwhile. Every duplicate raven sees
// follows one of these lines, or a dispatcher killed between raven's answer and the
// removal.
//
// LogAttemptFailed says an attempt failed and will be retried. When it failed without an
// answer from raven (a timeout), raven may have accepted it all the same: the retry is
// then a duplicate, the other cause that G5 names.
const (
	LogAttemptFailed = "attempt failed; will retry"
	LogRemovalFailed = "raven accepted the request but removing it from the queue failed; retrying, and until it lands the request may be sent again"
	LogRemovalLate   = "delivered request removed from the queue only after the partition's lease could have lapsed; another instance may have sent it again"
)

// remove deletes a delivered request from the queue, retrying until it lands or ctx ends
// (shutdown). A failure, or a removal that lands after the lease could have lapsed
// (sendBy, zero without leases), is logged with the request's id and counted: these are
// what make a duplicate possible.
func (d *Dispatcher) remove(ctx context.Context, st request.Stored, sendBy time.Time) error {
	err := d.src.Delete(ctx, st.Seq)
	if err == nil {
		if !sendBy.IsZero() && d.now().After(sendBy.Add(d.cfg.leaseMargin())) {
			d.cfg.Metrics.removalFailed()
			d.log.Warn().Str("client_id", st.ClientID).Str("request_id", st.ID).Msg(LogRemovalLate)
		}
		return nil
	}
	d.cfg.Metrics.removalFailed()
	d.log.Warn().Err(err).Str("client_id", st.ClientID).Str("request_id", st.ID).Msg(LogRemovalFailed)
	if err := d.retry(ctx, true, func() error { return d.src.Delete(ctx, st.Seq) }); err != nil {
		d.cfg.Metrics.unremoved()
		d.log.Warn().Str("client_id", st.ClientID).Str("request_id", st.ID).Msg("delivered request left in the queue at shutdown: it will be sent again")
		return err
	}
	d.log.Info().Str("client_id", st.ClientID).Str("request_id", st.ID).Msg("delivered request removed from the queue after retrying")
	return nil
}

// finish moves st to the dead-letter stream, then removes it from the queue, retrying
// both until they succeed or ctx ends.
func (d *Dispatcher) finish(ctx context.Context, st request.Stored, why request.DeadLetter) error {
	return d.retry(ctx, false, func() error {
		if err := d.src.DeadLetter(ctx, st, why); err != nil {
			return err
		}
		return d.src.Delete(ctx, st.Seq)
	})
}

// retry runs op until it succeeds or ctx ends, backing off up to 2s between tries. The
// queue being briefly unreachable must not turn a delivered request into a resent one.
//
// logged says the caller has logged the first failure already: the tries then warn of
// nothing themselves.
func (d *Dispatcher) retry(ctx context.Context, logged bool, op func() error) error {
	wait := 50 * time.Millisecond
	for tries := 1; ; tries++ {
		err := op()
		if err == nil {
			if tries > 1 {
				d.log.Info().Int("tries", tries).Msg("queue operation succeeded after retrying")
			}
			return nil
		}
		// The first failure is a warning, with its cause; the retries after it are debug
		// (a line per retry per request would say the same many times), and a success
		// after them says so.
		ev := d.log.Debug()
		if tries == 1 && !logged {
			ev = d.log.Warn()
		}
		ev.Err(err).Dur("retry_in", wait).Msg("queue operation failed; retrying")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(wait*2, 2*time.Second)
	}
}

func statusOf(err error) int {
	var sc interface{ StatusCode() int }
	if errors.As(err, &sc) {
		return sc.StatusCode()
	}
	return 0
}

// steer applies one steering change.
func (l *loop) steer(c SteerChange) {
	if c.Client == "" {
		iv := c.Steer.Interval
		if iv <= 0 {
			iv = l.d.cfg.Interval
		}
		if iv != l.sched.Interval() {
			l.d.log.Info().Stringer("interval", iv).Msg("global interval changed")
		}
		l.sched.SetInterval(iv, l.d.now())
		return
	}
	l.sched.Steer(c.Client, c.Steer, l.d.now())
}

type laneQuery struct {
	subjects []string
	limit    int
	reply    chan []LaneInfo
}

func (l *loop) lanesOf(q laneQuery) []LaneInfo {
	if q.subjects == nil {
		return l.sched.LaneInfos(q.limit)
	}
	var out []LaneInfo
	for _, s := range q.subjects {
		if li, ok := l.sched.Lane(s); ok {
			out = append(out, li)
		}
	}
	return out
}

// Lanes describes this instance's lanes for the given request subjects (those it holds
// no lane for are left out), or up to limit of its lanes when subjects is nil.
func (d *Dispatcher) Lanes(ctx context.Context, subjects []string, limit int) ([]LaneInfo, error) {
	q := laneQuery{subjects: subjects, limit: limit, reply: make(chan []LaneInfo, 1)}
	select {
	case d.queries <- q:
	case <-ctx.Done():
		return nil, fmt.Errorf("dispatcher did not answer: %w", ctx.Err())
	}
	select {
	case out := <-q.reply:
		return out, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("dispatcher did not answer: %w", ctx.Err())
	}
}
