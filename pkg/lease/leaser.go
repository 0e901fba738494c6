package lease

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Kind says what an Event tells the dispatcher's loop of a partition.
type Kind int

// What the Leaser tells the loop.
const (
	Acquired Kind = iota // the partition is ours; send after the fence (NotBefore)
	Renewed              // the lease is ours until ValidUntil
	Lost                 // the lease is gone: stop at once
	Release              // hand the partition back: stop starting sends, drain, close Done
)

// LogRenewalsLapsed is logged with the partitions whose lease renewals failed until the
// lease could have expired: the instance stops holding them, and takes them again (or
// another instance does).
const LogRenewalsLapsed = "lease renewals failed until the leases could have expired; letting those partitions go"

// Event is one change of this instance's hold on a partition, for the loop: no attempt
// there starts after ValidUntil, nor (Acquired) before NotBefore.
type Event struct {
	Kind       Kind
	Partition  int
	ValidUntil time.Time
	NotBefore  time.Time // Acquired: no attempt before this (zero: no wait beyond the fence)
	Done       chan struct{}
}

// Leaser holds this instance's share of the partitions through leases.
//
// Fencing: a lease renewed by a request sent at t expires on the server no sooner than
// t+ttl, by when this instance must have finished every attempt in that partition. So it
// starts attempts only until t+ttl-margin, with margin at least the send timeout. Whoever
// takes the partition next does so after the expiry (or after this instance drained and
// released it) and then waits one full interval before its first attempt. Neither step
// compares clocks between hosts.
//
// The expiry is the one step the instances do not time themselves: the store removes a
// lease by its own wall clock, and a jump of that clock can remove it early, while its
// holder still sends. So the successor also times it: every instance watches the leases,
// and one that takes a partition whose last renewal by another instance it saw at o
// starts no attempt there before o+ttl, by its own monotonic clock. The holder sent that
// renewal before o, so it has stopped by then. After a normal expiry this adds nothing
// (the expiry is at about o+ttl already). A release says that its holder drained the
// partition, and only its holder: an earlier holder whose lease the store's clock removed
// may still be sending, so the renewals of every holder are kept, and a release forgets
// only those of the instance that released. Renewals made before the watch began were not
// seen: for a TTL after it begins (after start, or after the watch broke), a partition
// taken over waits until then, unless the store had never been written to.
type Leaser struct {
	store      Store
	id         string
	partitions int
	ttl        time.Duration
	margin     time.Duration
	every      time.Duration
	now        func() time.Time
	events     chan<- Event
	log        zerolog.Logger

	held    map[int]*holding
	drained chan drained
	members []string // the instances listed last

	seenMu     sync.Mutex
	seen       map[int]map[string]time.Time // when each other instance's lease on a partition was last seen written
	holder     map[int]write                // who wrote each partition's lease last, and at which revision: a release is by them
	clean      map[int]bool                 // released while this watch ran: every earlier holder had stopped
	beats      map[string]time.Time         // when each instance's heartbeat was last seen
	seenRev    uint64                       // the store revision the watch has reached
	watching   bool                         // the watch is running
	watchGen   uint64                       // which watch: the end of an earlier one is not this one's
	blindUntil time.Time                    // until then, renewals may have gone unseen (no watch, or a new one)
	fresh      bool                         // the store had never been written to when the first watch began
}

// holding is one acquisition of a partition's lease, until it is lost or handed back.
type holding struct {
	rev        uint64    // the lease's current revision
	validUntil time.Time // no attempt starts after this unless renewed (what the loop was told)
	fence      time.Time // no attempt before this: an earlier holder may still send until then
	releasing  bool      // being handed back: the loop is draining it
}

// drained says the loop has drained partition p for holding h.
type drained struct {
	p int
	h *holding
}

// Config is what a Leaser needs: the store, this instance's id, how many partitions there
// are, the leases' TTL, how long before a lease could lapse sends stop (Margin: at least
// the longest attempt), how often leases are renewed, and the clock.
type Config struct {
	Store      Store
	ID         string
	Partitions int
	TTL        time.Duration
	Margin     time.Duration
	Every      time.Duration
	Now        func() time.Time
	Log        zerolog.Logger
}

// New returns the Leaser of cfg's partitions, telling the loop through events.
func New(cfg Config, events chan<- Event) *Leaser {
	return &Leaser{store: cfg.Store, id: cfg.ID, partitions: cfg.Partitions,
		ttl: cfg.TTL, margin: cfg.Margin, every: cfg.Every, now: cfg.Now,
		events: events, log: cfg.Log, held: map[int]*holding{}, drained: make(chan drained, cfg.Partitions),
		seen: map[int]map[string]time.Time{}, holder: map[int]write{}, clean: map[int]bool{},
		beats: map[string]time.Time{}}
}

func (m *Leaser) Run(ctx context.Context) {
	wake := make(chan struct{}, 1)
	poke := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	if written, err := m.store.Written(ctx); err == nil && !written {
		m.fresh = true
	}
	stop := m.watch(ctx, poke)
	defer func() { stop() }()
	rewatch := func() {
		m.seenMu.Lock()
		lost := !m.watching
		if lost {
			m.blindUntil = m.now().Add(100 * 365 * 24 * time.Hour) // until a watch runs again
		}
		m.seenMu.Unlock()
		if lost {
			stop()
			stop = m.watch(ctx, poke)
		}
	}
	ticker := time.NewTicker(m.every)
	defer ticker.Stop()
	m.round(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			rewatch()
			m.round(ctx)
		case <-wake:
			m.round(ctx)
		case d := <-m.drained:
			// Only the holding that was handed back: the lease may have been lost and
			// taken again since, and that new holding is not being handed back.
			if m.held[d.p] != d.h {
				continue
			}
			if err := m.store.Release(ctx, d.p, d.h.rev); err != nil {
				m.log.Warn().Err(err).Int("partition", d.p).Msg("releasing lease failed; it will expire instead")
			}
			delete(m.held, d.p)
			m.log.Debug().Int("partition", d.p).Msg("partition handed back")
		}
	}
}

func (m *Leaser) emit(ctx context.Context, e Event) {
	select {
	case m.events <- e:
	case <-ctx.Done():
	}
}

// round renews what this instance holds, hands back what is over its share, and takes
// free partitions up to its share.
func (m *Leaser) round(ctx context.Context) {
	// The heartbeat, the renewals and the listing of instances go out together, each with
	// a deadline of its own: one after the other, a slow store made a round longer than a
	// TTL, so that renewals came too late; and a call never answered (a listing whose end
	// never comes) held up every later round, renewals with it.
	var (
		wg      sync.WaitGroup
		members []string
		err     error
	)
	wg.Go(func() {
		hctx, cancel := context.WithTimeout(ctx, m.every)
		defer cancel()
		if err := m.store.Heartbeat(hctx, m.id); err != nil && ctx.Err() == nil {
			m.log.Warn().Err(err).Msg("heartbeat failed")
		}
	})
	wg.Go(func() {
		// As long as the renewals may take: a slow store lists in time, one that never
		// ends its listing holds the round up no longer than the renewals could.
		lctx, cancel := context.WithTimeout(ctx, m.ttl-m.margin)
		defer cancel()
		members, err = m.store.Members(lctx)
	})
	m.renewAll(ctx)
	wg.Wait()
	switch {
	case err == nil:
		m.members = members
	case ctx.Err() != nil:
		return
	default:
		// A store too slow to list in time is not a reason to leave free partitions
		// free: go on with the instances whose heartbeat the watch saw.
		members = m.membersSeen()
		m.log.Warn().Err(err).Int("instances_seen", len(members)).Msg("listing instances failed; going on with those whose heartbeat the watch saw")
	}
	n := len(members)
	if !slices.Contains(members, m.id) {
		n++
	}
	share := (m.partitions + n - 1) / n

	if excess := len(m.held) - share; excess > 0 {
		m.handBack(ctx, excess, share, n)
		return
	}
	m.acquire(ctx, share, n)
}

// handBack hands excess partitions back to balance: the highest-numbered ones, but none
// before its fence has passed.
func (m *Leaser) handBack(ctx context.Context, excess, share, n int) {
	keys := slices.Sorted(maps.Keys(m.held))
	var back []int
	defer func() {
		if len(back) > 0 {
			m.log.Info().Ints("partitions", back).Int("share", share).Int("instances", n).Msg("handing partitions back to balance")
		}
	}()
	// The highest-numbered ones, but none before its fence has passed: a release
	// tells the others that every earlier holder has stopped (see saw). Those wait
	// for a later round.
	now, going := m.now(), 0
	for i := len(keys) - 1; i >= 0 && going < excess; i-- {
		p := keys[i]
		h := m.held[p]
		if h.releasing {
			going++
			continue
		}
		if now.Before(h.fence) {
			continue
		}
		going++
		h.releasing = true
		back = append(back, p)
		done := make(chan struct{})
		m.log.Debug().Int("partition", p).Int("share", share).Msg("handing partition back to balance")
		m.emit(ctx, Event{Kind: Release, Partition: p, Done: done})
		go func() {
			select {
			case <-done:
				m.drained <- drained{p, h}
			case <-ctx.Done():
			}
		}()
	}
}

// renewAll renews every lease held, all at once. Each renewal waits for its answer for as
// long as the validity it would give lasts (TTL - margin from when it was sent): an answer
// later than the renewal period still counts, as that validity runs from the sending, and
// a renewal that landed but whose answer was given up on leaves the lease at a revision
// this instance does not know, which no later renewal can match. A lease whose renewals
// failed until it could have expired in the store is let go, as if lost: the loop had
// stopped sending there already, and the partition is free to be taken again, by anyone.
// Kept, it would stay closed for as long as the errors lasted, and no other instance would
// take it.
func (m *Leaser) renewAll(ctx context.Context) {
	type renewed struct {
		p    int
		sent time.Time
		rev  uint64
		ok   bool
		err  error
	}
	n := len(m.held)
	results := make(chan renewed, n)
	for p, h := range m.held {
		go func() {
			rctx, cancel := context.WithTimeout(ctx, m.ttl-m.margin)
			defer cancel()
			sent := m.now()
			rev, ok, err := m.store.Renew(rctx, p, m.id, h.rev)
			results <- renewed{p, sent, rev, ok, err}
		}()
	}
	failed := 0
	var cause error
	var lapsedPs []int
	for range n {
		r := <-results
		switch {
		case r.err != nil && ctx.Err() == nil && !m.now().Before(m.held[r.p].validUntil.Add(m.margin)):
			// Renewals failed until the lease could have expired in the store (a TTL after
			// the last one that landed): it is gone, or another's. Before that, a later
			// renewal that lands lets sends resume; a loaded machine answers late at times.
			lapsedPs = append(lapsedPs, r.p)
			delete(m.held, r.p)
			m.emit(ctx, Event{Kind: Lost, Partition: r.p})
		case r.err != nil:
			failed, cause = failed+1, r.err
		case !r.ok:
			m.log.Warn().Int("partition", r.p).Msg("lease lost")
			delete(m.held, r.p)
			m.emit(ctx, Event{Kind: Lost, Partition: r.p})
		default:
			h := m.held[r.p]
			h.rev, h.validUntil = r.rev, r.sent.Add(m.ttl-m.margin)
			m.emit(ctx, Event{Kind: Renewed, Partition: r.p, ValidUntil: h.validUntil})
		}
	}
	if len(lapsedPs) > 0 {
		slices.Sort(lapsedPs)
		m.log.Warn().Ints("partitions", lapsedPs).Msg(LogRenewalsLapsed)
	}
	if failed > 0 && ctx.Err() == nil {
		m.log.Warn().Err(cause).Int("partitions", failed).Msg("renewing leases failed; sends there stop when they would lapse")
	}
}

// releaseAll leaves and hands every lease back; the dispatcher has drained by then. It
// leaves first, so that the others count one instance fewer when they see the releases.
// A lease still inside its fence is not released but left to expire: a release tells
// the others that every earlier holder has stopped, which is not yet so.
func (m *Leaser) ReleaseAll(ctx context.Context) {
	if err := m.store.Leave(ctx, m.id); err != nil {
		m.log.Warn().Err(err).Msg("leaving failed; the heartbeat will expire instead")
	}
	now := m.now()
	var fenced []int
	clean := map[int]*holding{}
	for p, h := range m.held {
		if now.Before(h.fence) {
			fenced = append(fenced, p)
		} else {
			clean[p] = h
		}
	}
	defer clear(m.held)
	if len(fenced) == 0 {
		n, err := m.store.ReleaseAll(ctx, m.id)
		if err != nil {
			m.log.Warn().Err(err).Msg("releasing leases failed; they will expire instead")
		}
		m.log.Info().Int("partitions", n).Msg("leases handed back")
		return
	}
	slices.Sort(fenced)
	n := 0
	for p, h := range clean {
		if err := m.store.Release(ctx, p, h.rev); err != nil {
			m.log.Warn().Err(err).Int("partition", p).Msg("releasing lease failed; it will expire instead")
			continue
		}
		n++
	}
	m.log.Info().Int("partitions", n).Ints("left_to_expire", fenced).Msg("leases handed back, but for those still inside their fence")
}
