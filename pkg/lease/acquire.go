package lease

import (
	"context"
	"hash/fnv"
	"slices"
	"time"
)

// How the leaser takes free partitions up to its share (see Leaser).

// acquire takes free partitions until this instance holds its share (or a renewal period
// has passed), trying as many at once as it lacks, starting from a place of its own so
// that instances do not all race for the same ones.
func (m *Leaser) acquire(ctx context.Context, share, instances int) {
	candidates := m.candidates()
	// Batches go one after another while the ones tried are held by others; after a
	// renewal period the rest wait for the next round, so that a slow store does not
	// hold the renewals up past a TTL (seen: six batches of a second each).
	until := m.now().Add(m.every)
	for len(candidates) > 0 && len(m.held) < share && ctx.Err() == nil && m.now().Before(until) {
		batch := candidates[:min(share-len(m.held), len(candidates))]
		candidates = candidates[len(batch):]
		results := make(chan got, len(batch))
		// As long as the validity it would give: a shorter wait gave every acquisition up
		// in a store slower than that (each landed, unknown, and was tried again). One
		// given up on all the same is adopted in a later round, from the watch.
		wait := m.ttl - m.margin
		for _, p := range batch {
			own, ownRev := m.ownLease(p)
			go func() { results <- m.try(ctx, p, own, ownRev, wait) }()
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
			h := &holding{rev: r.rev, validUntil: r.sent.Add(m.ttl - m.margin), fence: m.notBefore(r.p, sure)}
			m.held[r.p] = h
			m.log.Debug().Int("partition", r.p).Int("share", share).Int("instances", instances).Msg("partition acquired")
			m.emit(ctx, Event{Kind: Acquired, Partition: r.p, ValidUntil: h.validUntil, NotBefore: h.fence})
		}
		if failed {
			return
		}
	}
}

// candidates is the partitions this instance does not hold, in its own order, those the
// watch shows held by another instance last: with a slow store a round may try one batch
// only, and trying the same held ones first every round would never reach a free one
// (seen: a partition left free for a minute).
func (m *Leaser) candidates() []int {
	start := int(hashOf(m.id) % uint32(m.partitions))
	var free, heldByOthers []int
	for i := range m.partitions {
		switch p := (start + i) % m.partitions; {
		case m.held[p] != nil:
		case m.looksHeld(p):
			heldByOthers = append(heldByOthers, p)
		default:
			free = append(free, p)
		}
	}
	return append(free, heldByOthers...)
}

// got is one try at a partition's lease: when it was sent, and what the store answered.
type got struct {
	p    int
	sent time.Time
	rev  uint64
	ok   bool
	err  error
}

// try tries to take partition p's lease within wait. When the watch shows a lease of
// this instance's that it does not hold (own, at ownRev: an acquisition or renewal whose
// answer was lost), it takes it back by renewing it, the validity counted from this
// renewal.
func (m *Leaser) try(ctx context.Context, p int, own bool, ownRev uint64, wait time.Duration) got {
	actx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	sent := m.now()
	var rev uint64
	var ok bool
	var err error
	if own {
		rev, ok, err = m.store.Renew(actx, p, m.id, ownRev)
	}
	if !own || !ok && err == nil { // not ours, or ours no longer (it expired)
		sent = m.now()
		rev, ok, err = m.store.Acquire(actx, p, m.id)
	}
	return got{p, sent, rev, ok, err}
}

func hashOf(s string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(s))
	return h.Sum32()
}
