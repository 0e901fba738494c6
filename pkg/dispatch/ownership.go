package dispatch

import (
	"context"
	"hash/fnv"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

type ownKind int

const (
	ownAcquired ownKind = iota // the partition is ours; send after the fence
	ownRenewed                 // the lease is ours until validUntil
	ownLost                    // the lease is gone: stop at once
	ownRelease                 // hand the partition back: stop starting sends, drain, close done
)

type ownEvent struct {
	kind       ownKind
	partition  int
	validUntil time.Time
	notBefore  time.Time // acquired: no attempt before this (zero: no wait beyond the fence)
	done       chan struct{}
}

// leaser holds this instance's share of the partitions through leases.
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
// and one that takes a partition whose last renewal (by another instance) it saw at o
// starts no attempt there before o+ttl, by its own monotonic clock. The holder sent that
// renewal before o, so it has stopped by then. After a normal expiry this adds nothing
// (the expiry is at about o+ttl already); a partition released on purpose was drained
// first and needs no wait.
type leaser struct {
	store      LeaseStore
	id         string
	partitions int
	ttl        time.Duration
	margin     time.Duration
	every      time.Duration
	now        clock
	events     chan<- ownEvent
	log        zerolog.Logger

	held    map[int]*holding
	drained chan drained

	seenMu     sync.Mutex
	seen       map[int]time.Time // when another instance's lease on a partition was last seen
	seenRev    uint64            // the store revision the watch has reached
	watching   bool              // the watch is running
	blindUntil time.Time         // until then, renewals may have gone unseen (no watch, or a new one)
}

// saw notes a change to a lease seen in the store.
func (m *leaser) saw(p int, owner string, released bool, rev uint64) {
	m.seenMu.Lock()
	defer m.seenMu.Unlock()
	m.seenRev = max(m.seenRev, rev)
	switch {
	case p < 0 || owner == m.id:
	case released:
		delete(m.seen, p) // handed back drained: nothing of its holder's is in flight
	default:
		m.seen[p] = m.now()
	}
}

// watchCaughtUp gives the watch a moment (a second at most) to reach revision rev, that of
// the latest acquisition: every renewal made before it has a lower one. It says whether
// the watch got there, running.
func (m *leaser) watchCaughtUp(rev uint64) bool {
	for deadline := m.now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
		m.seenMu.Lock()
		caught, watching := m.seenRev >= rev, m.watching
		m.seenMu.Unlock()
		if caught || !watching || m.now().After(deadline) {
			return caught && watching
		}
	}
}

// notBefore is the earliest this instance may start attempts in partition p, just taken
// over: a full TTL after the last renewal by another instance that it saw, since the
// store's clock may have removed that lease early. Unless the watch is sure (it reached
// the acquisition's revision, and has been running for a TTL at least), it may have missed
// renewals, and then it is a full TTL from now.
func (m *leaser) notBefore(p int, sure bool) time.Time {
	m.seenMu.Lock()
	defer m.seenMu.Unlock()
	now := m.now()
	if !sure || now.Before(m.blindUntil) {
		return now.Add(m.ttl)
	}
	if o, ok := m.seen[p]; ok {
		return o.Add(m.ttl)
	}
	return time.Time{}
}

// watch starts watching the leases; lost marks the watch gone, for the next round to
// start it again.
func (m *leaser) watch(ctx context.Context, poke func()) (stop func()) {
	stop, err := m.store.WatchLeases(ctx, func(p int, owner string, released bool, rev uint64) {
		m.saw(p, owner, released, rev)
		if released {
			poke()
		}
	}, func(err error) {
		m.log.Warn().Err(err).Msg("the lease watch ended; partitions taken over wait a full TTL until it runs again")
		m.seenMu.Lock()
		m.watching = false
		m.seenMu.Unlock()
	})
	m.seenMu.Lock()
	defer m.seenMu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn().Err(err).Msg("cannot watch the leases; partitions taken over wait a full TTL")
		}
		return func() {}
	}
	if m.watching = true; !m.blindUntil.IsZero() {
		// Started again after a gap: renewals in the gap went unseen.
		m.blindUntil = m.now().Add(m.ttl)
	}
	return stop
}

// holding is one acquisition of a partition's lease, until it is lost or handed back.
type holding struct {
	rev       uint64 // the lease's current revision
	releasing bool   // being handed back: the loop is draining it
}

// drained says the loop has drained partition p for holding h.
type drained struct {
	p int
	h *holding
}

// newLeaser returns the leaser of d's partitions, telling the loop through events.
func newLeaser(d *Dispatcher, events chan<- ownEvent) *leaser {
	return &leaser{store: d.cfg.Leases, id: d.cfg.InstanceID, partitions: d.src.Partitions(),
		ttl: d.cfg.LeaseTTL, margin: d.cfg.leaseMargin(), every: d.cfg.leaseEvery(), now: d.now,
		events: events, log: d.log, held: map[int]*holding{}, drained: make(chan drained, d.src.Partitions()),
		seen: map[int]time.Time{}}
}

func (m *leaser) run(ctx context.Context) {
	wake := make(chan struct{}, 1)
	poke := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
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

func (m *leaser) emit(ctx context.Context, e ownEvent) {
	select {
	case m.events <- e:
	case <-ctx.Done():
	}
}

// round renews what this instance holds, hands back what is over its share, and takes
// free partitions up to its share.
func (m *leaser) round(ctx context.Context) {
	if err := m.store.Heartbeat(ctx, m.id); err != nil && ctx.Err() == nil {
		m.log.Warn().Err(err).Msg("heartbeat failed")
	}
	m.renewAll(ctx)
	members, err := m.store.Members(ctx)
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn().Err(err).Msg("listing instances failed; not rebalancing this round")
		}
		return
	}
	n := len(members)
	if !slices.Contains(members, m.id) {
		n++
	}
	share := (m.partitions + n - 1) / n

	if excess := len(m.held) - share; excess > 0 {
		keys := slices.Sorted(maps.Keys(m.held))
		var back []int
		defer func() {
			if len(back) > 0 {
				m.log.Info().Ints("partitions", back).Int("share", share).Int("instances", n).Msg("handing partitions back to balance")
			}
		}()
		for _, p := range keys[len(keys)-excess:] { // the highest-numbered ones
			h := m.held[p]
			if h.releasing {
				continue
			}
			h.releasing = true
			back = append(back, p)
			done := make(chan struct{})
			m.log.Debug().Int("partition", p).Int("share", share).Msg("handing partition back to balance")
			m.emit(ctx, ownEvent{kind: ownRelease, partition: p, done: done})
			go func() {
				select {
				case <-done:
					m.drained <- drained{p, h}
				case <-ctx.Done():
				}
			}()
		}
		return
	}
	m.acquire(ctx, share, n)
}

// renewAll renews every lease held, all at once and each bounded by the renewal period:
// one after the other, a store that does not answer would hold a round up for minutes
// (a timeout per lease), and with it the heartbeat and the rebalancing.
func (m *leaser) renewAll(ctx context.Context) {
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
			rctx, cancel := context.WithTimeout(ctx, m.every)
			defer cancel()
			sent := m.now()
			rev, ok, err := m.store.Renew(rctx, p, m.id, h.rev)
			results <- renewed{p, sent, rev, ok, err}
		}()
	}
	failed := 0
	var cause error
	for range n {
		r := <-results
		switch {
		case r.err != nil:
			failed, cause = failed+1, r.err
		case !r.ok:
			m.log.Warn().Int("partition", r.p).Msg("lease lost")
			delete(m.held, r.p)
			m.emit(ctx, ownEvent{kind: ownLost, partition: r.p})
		default:
			m.held[r.p].rev = r.rev
			m.emit(ctx, ownEvent{kind: ownRenewed, partition: r.p, validUntil: r.sent.Add(m.ttl - m.margin)})
		}
	}
	if failed > 0 && ctx.Err() == nil {
		m.log.Warn().Err(cause).Int("partitions", failed).Msg("renewing leases failed; sends there stop when they would lapse")
	}
}

// acquire takes free partitions until this instance holds its share, trying as many at
// once as it lacks, starting from a place of its own so that instances do not all race
// for the same ones.
func (m *leaser) acquire(ctx context.Context, share, instances int) {
	start := int(hashOf(m.id) % uint32(m.partitions))
	var candidates []int
	for i := range m.partitions {
		p := (start + i) % m.partitions
		if m.held[p] == nil {
			candidates = append(candidates, p)
		}
	}
	type got struct {
		p    int
		sent time.Time
		rev  uint64
		ok   bool
		err  error
	}
	for len(candidates) > 0 && len(m.held) < share && ctx.Err() == nil {
		batch := candidates[:min(share-len(m.held), len(candidates))]
		candidates = candidates[len(batch):]
		results := make(chan got, len(batch))
		for _, p := range batch {
			go func() {
				sent := m.now()
				rev, ok, err := m.store.Acquire(ctx, p, m.id)
				results <- got{p, sent, rev, ok, err}
			}()
		}
		failed := false
		var taken []got
		for range batch {
			r := <-results
			switch {
			case r.err != nil:
				failed = true
				if ctx.Err() == nil {
					m.log.Warn().Err(r.err).Int("partition", r.p).Msg("acquiring lease failed")
				}
			case r.ok:
				taken = append(taken, r)
			}
		}
		var newest uint64
		for _, r := range taken {
			newest = max(newest, r.rev)
		}
		sure := m.watchCaughtUp(newest)
		if len(taken) > 0 { // one line for the batch (usually the round), before any is used; each at debug
			ps := make([]int, 0, len(taken))
			for _, r := range taken {
				ps = append(ps, r.p)
			}
			slices.Sort(ps)
			m.log.Info().Int("acquired", len(ps)).Ints("partitions", ps).Int("held", len(m.held)+len(ps)).Int("share", share).
				Int("instances", instances).Msg("partitions acquired")
		}
		for _, r := range taken {
			m.held[r.p] = &holding{rev: r.rev}
			m.log.Debug().Int("partition", r.p).Int("share", share).Int("instances", instances).Msg("partition acquired")
			m.emit(ctx, ownEvent{kind: ownAcquired, partition: r.p, validUntil: r.sent.Add(m.ttl - m.margin), notBefore: m.notBefore(r.p, sure)})
		}
		if failed {
			return
		}
	}
}

// releaseAll leaves and hands every lease back; the dispatcher has drained by then. It
// leaves first, so that the others count one instance fewer when they see the releases.
func (m *leaser) releaseAll(ctx context.Context) {
	if err := m.store.Leave(ctx, m.id); err != nil {
		m.log.Warn().Err(err).Msg("leaving failed; the heartbeat will expire instead")
	}
	n, err := m.store.ReleaseAll(ctx, m.id)
	if err != nil {
		m.log.Warn().Err(err).Msg("releasing leases failed; they will expire instead")
	}
	m.log.Info().Int("partitions", n).Msg("leases handed back")
	clear(m.held)
}

func hashOf(s string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(s))
	return h.Sum32()
}
