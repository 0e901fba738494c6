package lease

import (
	"context"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// The leaser's watch of the lease store: every instance sees every lease written, so that
// one taking a partition over times the earlier holder's expiry itself (see Leaser).

// saw notes a change to a lease seen in the store.
func (m *Leaser) saw(c request.LeaseChange) {
	p, owner, released, rev := c.Partition, c.Owner, c.Released, c.Rev
	m.seenMu.Lock()
	defer m.seenMu.Unlock()
	m.seenRev = max(m.seenRev, rev)
	switch {
	case c.Heartbeat:
		if !released && owner != "" {
			m.beats[owner] = m.now()
		}
	case released:
		// Handed back by the instance that wrote it last, drained, and only once its own
		// fence had passed (see round): nothing of that instance's is in flight there,
		// and every holder before it had stopped. Anyone else's renewal seen stays. From
		// now on this watch sees every write of p: no renewal of it can go unseen.
		if h, ok := m.holder[p]; ok {
			delete(m.seen[p], h.owner)
			delete(m.holder, p)
		}
		m.clean[p] = true
	default:
		m.holder[p] = write{owner, rev}
		if owner == m.id {
			return
		}
		now := m.now()
		if m.seen[p] == nil {
			m.seen[p] = map[string]time.Time{}
		}
		for o, at := range m.seen[p] {
			if now.Sub(at) > m.ttl {
				delete(m.seen[p], o) // its holder has stopped by now
			}
		}
		m.seen[p][owner] = now
	}
}

// watchCaughtUp gives the watch a moment (a second at most) to reach revision rev, that of
// the latest acquisition: every renewal made before it has a lower one. It says whether
// the watch got there, running.
func (m *Leaser) watchCaughtUp(rev uint64) bool {
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
// over: a full TTL after the last renewal by each other instance that it saw, since the
// store's clock may have removed that lease early. A renewal made before the watch began
// went unseen, but its holder stops within a TTL of it: so while the watch has run for
// less than a TTL, no attempt before a TTL after it began, unless the watch saw p
// released (its holder released it drained and past its own fence: nobody earlier is
// sending, and every later renewal is seen). Unless the watch is sure (it reached the
// acquisition's revision), it is a full TTL from now.
func (m *Leaser) notBefore(p int, sure bool) time.Time {
	m.seenMu.Lock()
	defer m.seenMu.Unlock()
	now := m.now()
	if !sure {
		return now.Add(m.ttl)
	}
	var nb time.Time
	if now.Before(m.blindUntil) && !m.clean[p] {
		nb = m.blindUntil
	}
	for _, o := range m.seen[p] {
		if until := o.Add(m.ttl); until.After(nb) {
			nb = until
		}
	}
	return nb
}

// watch starts watching the leases; lost marks the watch gone, for the next round to
// start it again.
func (m *Leaser) watch(ctx context.Context, poke func()) (stop func()) {
	m.seenMu.Lock()
	first := m.fresh // the first watch of a store never written to misses nothing
	m.fresh = false
	m.watchGen++
	gen := m.watchGen
	m.watching = true // before the watch can say it ended: that must not be lost
	clear(m.clean)    // releases seen by an earlier watch say nothing of writes since
	m.seenMu.Unlock()
	ended := func() {
		m.seenMu.Lock()
		if m.watchGen == gen {
			m.watching = false
		}
		m.seenMu.Unlock()
	}
	stop, err := m.store.WatchLeases(ctx, func(c request.LeaseChange) {
		m.saw(c)
		if c.Released {
			poke()
		}
	}, func(err error) {
		m.log.Warn().Err(err).Msg("the lease watch ended; partitions taken over wait a full TTL until it runs again")
		ended()
	})
	if err != nil {
		ended()
		if ctx.Err() == nil {
			m.log.Warn().Err(err).Msg("cannot watch the leases; partitions taken over wait a full TTL")
		}
		return func() {}
	}
	m.seenMu.Lock()
	defer m.seenMu.Unlock()
	if !first {
		// Renewals before the watch began (the instance just started, or the watch broke)
		// went unseen.
		m.blindUntil = m.now().Add(m.ttl)
	}
	return stop
}

// membersSeen are the instances whose heartbeat the watch saw within a TTL, this one
// included: who is alive when the store cannot list them. Without a running watch, those
// listed last.
func (m *Leaser) membersSeen() []string {
	m.seenMu.Lock()
	defer m.seenMu.Unlock()
	if !m.watching {
		return m.members
	}
	ids := []string{m.id}
	now := m.now()
	for id, at := range m.beats {
		if id != m.id && now.Sub(at) < m.ttl {
			ids = append(ids, id)
		}
	}
	return ids
}

// write is a lease write the watch saw: by whom, at which revision.
type write struct {
	owner string
	rev   uint64
}

// ownLease says whether the watch shows partition p's lease written last by this
// instance, and at which revision.
func (m *Leaser) ownLease(p int) (bool, uint64) {
	m.seenMu.Lock()
	defer m.seenMu.Unlock()
	h := m.holder[p]
	return h.owner == m.id, h.rev
}

// looksHeld says whether the watch saw another instance write partition p's lease within
// a TTL, and no release since.
func (m *Leaser) looksHeld(p int) bool {
	m.seenMu.Lock()
	defer m.seenMu.Unlock()
	h, ok := m.holder[p]
	if !ok || h.owner == m.id {
		return false
	}
	at, ok := m.seen[p][h.owner]
	return ok && m.now().Sub(at) < m.ttl
}
