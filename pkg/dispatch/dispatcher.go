package dispatch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Source is the queue as the dispatcher sees it.
type Source interface {
	// Backlog lists the subjects that have requests queued.
	Backlog(ctx context.Context) (map[string]uint64, error)
	// Watch calls fn with the subject of each request stored from now on; onErr hears of
	// trouble after which a Backlog listing is due.
	Watch(ctx context.Context, fn func(subject string), onErr func(error)) (stop func(), err error)
	// Head reads the oldest request on subject; ok is false when there is none.
	Head(ctx context.Context, subject string) (st request.Stored, ok bool, err error)
	// Delete removes a request; one already gone is not an error.
	Delete(ctx context.Context, seq uint64) error
	// DeadLetter writes a request to the dead-letter stream (it stays in the queue).
	DeadLetter(ctx context.Context, st request.Stored, why request.DeadLetter) error
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
)

// Config configures a Dispatcher.
type Config struct {
	Policy
	// MaxInFlight caps attempts in flight at once, across all clients. Defaults to 1024.
	MaxInFlight int
	// ShutdownGrace bounds how long Run waits for attempts in flight when it is stopped.
	// Defaults to 15s.
	ShutdownGrace time.Duration
	// ResyncEvery is how often the full backlog is listed again, as a safety net behind
	// the watch. Defaults to 30s.
	ResyncEvery time.Duration
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
	return c
}

// Validate reports every field that cannot work.
func (c Config) Validate() error {
	errs := []error{c.Policy.Validate()}
	if c.MaxInFlight < 1 {
		errs = append(errs, fmt.Errorf("max in flight %d: must be at least 1", c.MaxInFlight))
	}
	if c.ShutdownGrace < 0 || c.ResyncEvery <= 0 {
		errs = append(errs, fmt.Errorf("shutdown grace %s and resync %s: must not be negative", c.ShutdownGrace, c.ResyncEvery))
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
}

// New returns a Dispatcher. It owns every partition for as long as Run runs; a later
// ownership layer narrows that.
func New(cfg Config, src Source, snd Sender, log zerolog.Logger) (*Dispatcher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Dispatcher{cfg: cfg, src: src, snd: snd, log: log.With().Str("component", "dispatch").Logger(),
		now: time.Now, rand: rand.Float64}, nil
}

// Run dispatches until ctx is done, then lets attempts in flight finish within
// ShutdownGrace and returns.
//
// Run first waits one full interval before it starts any attempt: an attempt made by a
// process that ran before this one (and perhaps crashed mid-send) may have ended only
// just now, and spacing must hold across the restart.
func (d *Dispatcher) Run(ctx context.Context) error {
	sched := NewScheduler(d.cfg.Policy, d.rand)
	notes := make(chan string, 1<<16)
	resync := make(chan struct{}, 1)
	results := make(chan Result, d.cfg.MaxInFlight)
	askResync := func() {
		select {
		case resync <- struct{}{}:
		default:
		}
	}

	stopWatch, err := d.src.Watch(ctx, func(subj string) {
		select {
		case notes <- subj:
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

	fence := d.now().Add(d.cfg.Interval)
	d.log.Info().Stringer("fence", d.cfg.Interval).Msg("dispatcher started; first sends wait one interval")
	askResync()

	// Attempts run on a context that outlives ctx by the shutdown grace.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	ticker := time.NewTicker(d.cfg.ResyncEvery)
	defer ticker.Stop()
	// The backlog is listed off the loop, feeding the same channel as the watch, so that a
	// long listing never holds up sends that are due.
	listed := make(chan error, 1)
	listing := false

	for {
		now := d.now()
		for sched.InFlight() < d.cfg.MaxInFlight {
			job, ok := sched.Due(now)
			if !ok {
				break
			}
			go func() { results <- d.work(workCtx, job) }()
		}
		if next, ok := sched.Next(); ok && sched.InFlight() < d.cfg.MaxInFlight {
			timer.Reset(max(next.Sub(now), 0))
		} else {
			timer.Stop()
		}
		select {
		case <-ctx.Done():
			d.drain(sched, results, cancelWork)
			return nil
		case subj := <-notes:
			sched.Notify(subj, d.now(), fence)
			for more := true; more; { // take what else arrived without a trip around the loop
				select {
				case subj := <-notes:
					sched.Notify(subj, d.now(), fence)
				default:
					more = false
				}
			}
		case r := <-results:
			sched.Done(r, d.now())
		case <-timer.C:
		case <-ticker.C:
			askResync()
		case <-resync:
			if !listing {
				listing = true
				go func() { listed <- d.list(ctx, notes) }()
			}
		case err := <-listed:
			listing = false
			if err != nil && ctx.Err() == nil {
				d.log.Warn().Err(err).Msg("listing backlog failed; will retry")
				time.AfterFunc(time.Second, askResync)
			}
		}
	}
}

// list feeds every subject with a backlog into notes.
func (d *Dispatcher) list(ctx context.Context, notes chan<- string) error {
	backlog, err := d.src.Backlog(ctx)
	if err != nil {
		return err
	}
	for subj := range backlog {
		select {
		case notes <- subj:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	d.log.Debug().Int("clients", len(backlog)).Msg("backlog listed")
	return nil
}

func (d *Dispatcher) drain(sched *Scheduler, results <-chan Result, cancelWork context.CancelFunc) {
	if sched.InFlight() == 0 {
		return
	}
	d.log.Info().Int("in_flight", sched.InFlight()).Dur("grace", d.cfg.ShutdownGrace).Msg("draining attempts in flight")
	grace := time.NewTimer(d.cfg.ShutdownGrace)
	defer grace.Stop()
	for sched.InFlight() > 0 {
		select {
		case r := <-results:
			sched.Done(r, d.now())
		case <-grace.C:
			d.log.Warn().Int("in_flight", sched.InFlight()).Msg("shutdown grace over; cancelling attempts in flight")
			cancelWork()
		}
	}
}

// work looks at one client's head request and makes one attempt.
func (d *Dispatcher) work(ctx context.Context, job Job) Result {
	res := Result{Subject: job.Subject}
	st, ok, err := d.src.Head(ctx, job.Subject)
	if err != nil {
		d.log.Debug().Err(err).Str("subject", job.Subject).Msg("reading head request failed; will look again")
		res.Kind = Failed
		return res
	}
	if !ok {
		res.Kind = Empty
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

	log := d.log.With().Str("client_id", st.ClientID).Str("request_id", st.ID).Int("attempt", attempt).Logger()
	ev := log.Debug()
	if !job.PrevEnd.IsZero() {
		ev = ev.Int64("gap_ms", start.Sub(job.PrevEnd).Milliseconds())
	}
	ev.Dur("took", end.Sub(start)).Err(err).Msg("attempt")

	why := request.DeadLetter{Attempts: attempt, FirstAttempt: first, LastAttempt: start, LastStatus: statusOf(err)}
	var perm interface{ Permanent() bool }
	switch {
	case err == nil:
		if err := d.retry(ctx, func() error { return d.src.Delete(ctx, st.Seq) }); err != nil {
			res.Kind = Failed // shutting down; the request stays and is sent again later
			return res
		}
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
			log.Info().Err(err).Dur("retry_after", res.RetryAfter).Msg("attempt failed; will retry")
			return res
		}
	}
	if why.LastStatus == 0 {
		why.LastError = err.Error()
	}
	err = d.retry(ctx, func() error {
		if err := d.src.DeadLetter(ctx, st, why); err != nil {
			return err
		}
		return d.src.Delete(ctx, st.Seq)
	})
	if err != nil {
		res.Kind = Failed
		return res
	}
	log.Warn().Str("reason", why.Reason).Int("last_status", why.LastStatus).Msg("request dead-lettered")
	res.Kind = DeadLettered
	return res
}

// retry runs op until it succeeds or ctx ends, backing off up to 2s between tries. The
// queue being briefly unreachable must not turn a delivered request into a resent one.
func (d *Dispatcher) retry(ctx context.Context, op func() error) error {
	wait := 50 * time.Millisecond
	for {
		err := op()
		if err == nil {
			return nil
		}
		d.log.Warn().Err(err).Dur("retry_in", wait).Msg("queue operation failed")
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
