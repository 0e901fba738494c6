package dispatchsim

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// A run checked against the guarantees, from what raven saw and what the queue took and
// kept.

// check judges the run from raven's record, the queue and what the instances did.
func (w *World) check(left []request.Stored) *Report {
	added := w.queue.Added()
	attempts := w.raven.Attempts()
	rep := &Report{Seed: w.seed, Faults: len(w.timeline), Requests: len(added), Attempts: len(attempts)}
	c := &checks{w: w, rep: rep, added: added, attempts: attempts, dead: map[string]DeadLetter{}, accepted: map[string]Attempt{}, broken: map[string]bool{}}
	for _, d := range w.queue.DeadLetters() {
		if _, ok := c.dead[d.ID]; !ok {
			c.dead[d.ID] = d
		}
	}
	for _, a := range attempts { // each request's first acceptance
		if a.Accepted {
			if b, ok := c.accepted[a.ID]; !ok || a.AcceptedAt.Before(b.AcceptedAt) {
				c.accepted[a.ID] = a
			}
		}
	}
	byClient := c.spacing()
	c.cancelled = w.checkCancels(attempts, c.fail, c.at)
	w.mu.Lock()
	for id, seq := range w.cancelEvents {
		// A cancel that removed the request, and whose instance died before answering:
		// its caller heard an error, and the record says cancelled. It counts from its
		// removal's landing, and not at all if no removal landed.
		if _, ok := c.cancelled[id]; ok {
			continue
		}
		for _, d := range w.deletes[seq] {
			if !d.keep && !d.landed.IsZero() && (c.cancelled[id].IsZero() || d.landed.Before(c.cancelled[id])) {
				c.cancelled[id] = d.landed
			}
		}
	}
	w.mu.Unlock()
	c.order()
	c.duplicates()
	c.nothingLost(left)
	w.mu.Lock()
	for _, v := range w.unkept {
		c.fail(v[0], "%s", v[1])
	}
	w.mu.Unlock()
	if len(rep.Violations) > 0 {
		rep.Detail = w.detail(c.broken, byClient, c.at)
	}
	return rep
}

// checks is one run's check against the guarantees: what raven saw, what the queue took
// and kept, and the violations found.
type checks struct {
	w         *World
	rep       *Report
	added     []request.Stored
	attempts  []Attempt
	dead      map[string]DeadLetter // each request's first dead letter
	accepted  map[string]Attempt    // each request's first acceptance by raven
	cancelled map[string]time.Time  // when each request's cancel that answered cancelled was asked
	broken    map[string]bool       // the clients with a violation
}

func (c *checks) fail(client, format string, args ...any) {
	c.rep.Violations = append(c.rep.Violations, fmt.Sprintf(format, args...))
	c.broken[client] = true
}

func (c *checks) at(t time.Time) string { return fmt.Sprintf("%.3fs", t.Sub(c.w.start).Seconds()) }

// spacing checks G2 and G5: each client's attempts, in the order they started, each at
// least the interval after the end of the one before (which also keeps them from
// overlapping). It returns each client's attempts in that order.
func (c *checks) spacing() map[string][]Attempt {
	byClient := map[string][]Attempt{}
	for _, a := range c.attempts {
		byClient[a.Client] = append(byClient[a.Client], a)
	}
	for client, as := range byClient {
		slices.SortStableFunc(as, func(a, b Attempt) int { return a.Start.Compare(b.Start) })
		for i := 1; i < len(as); i++ {
			prev, a := as[i-1], as[i]
			if a.Start.Before(prev.End) {
				c.fail(client, "G5: %s's attempt of %s by %s at %s started while its attempt of %s by %s (%s-%s) was in flight",
					client, a.ID, a.Instance, c.at(a.Start), prev.ID, prev.Instance, c.at(prev.Start), c.at(prev.End))
			} else if gap := a.Start.Sub(prev.End); gap < c.w.cfg.Interval {
				c.fail(client, "G2: %s's attempt of %s by %s at %s came %s after its attempt of %s by %s ended at %s, under the interval %s",
					client, a.ID, a.Instance, c.at(a.Start), gap, prev.ID, prev.Instance, c.at(prev.End), c.w.cfg.Interval)
			}
		}
	}
	return byClient
}

// order checks G3: no attempt of a request before each earlier request of its client was
// accepted, dead-lettered or cancelled.
func (c *checks) order() {
	done := func(id string, by time.Time) bool {
		if a, ok := c.accepted[id]; ok && !a.AcceptedAt.After(by) {
			return true
		}
		if t, ok := c.cancelled[id]; ok && !t.After(by) {
			return true
		}
		d, ok := c.dead[id]
		return ok && !d.At.After(by)
	}
	for _, a := range c.attempts {
		for _, st := range c.added {
			if st.ClientID != a.Client || st.ID == a.ID {
				continue
			}
			if st.ID < a.ID && !done(st.ID, a.Start) {
				c.fail(a.Client, "G3: %s's %s attempted by %s at %s before %s was delivered or dead-lettered", a.Client, a.ID, a.Instance, c.at(a.Start), st.ID)
				break
			}
		}
	}
}

// duplicates checks that an attempt of a request raven had already accepted comes only
// of the causes the docs list: raven's answer never reached the instance (a timeout, a
// pause, a kill), or the removal that follows it was cut short by a fault (it failed, or
// landed late because the store was slow or the instance paused or killed). A removal the
// instance itself put off past its lease is not one of them.
func (c *checks) duplicates() {
	for _, a := range c.attempts {
		first, ok := c.accepted[a.ID]
		if !ok || !a.Start.After(first.AcceptedAt) {
			continue
		}
		if why := c.w.excused(first); why == "" {
			c.fail(a.Client, "duplicate: %s sent again by %s at %s after raven accepted it from %s at %s, and %s removed it only at %s: no fault explains it",
				a.ID, a.Instance, c.at(a.Start), first.Instance, c.at(first.AcceptedAt), first.Instance, c.w.removedAt(a.ID, first.Instance, c.at))
		}
	}
}

// nothingLost checks G4 and liveness: by the end every request was accepted,
// dead-lettered or cancelled, and none is left in the queue.
func (c *checks) nothingLost(left []request.Stored) {
	queued := map[string]bool{}
	for _, st := range left {
		queued[st.ID] = true
	}
	for _, st := range c.added {
		if _, ok := c.accepted[st.ID]; !ok && !queued[st.ID] && c.cancelled[st.ID].IsZero() {
			if _, ok := c.dead[st.ID]; !ok {
				c.fail(st.ClientID, "G4: %s left the queue neither delivered nor dead-lettered (removals: %s)", st.ID, c.w.removals(st.Seq, c.at))
			}
		}
	}
	for _, st := range left {
		p := st.Lane.Partition
		c.fail(st.ClientID, "liveness: %s still queued %s after the faults ended (partition %d, held in the store by %q)",
			st.ID, c.w.set.Bound, p, c.w.store.Owners()[p])
	}
}

// excused says which listed cause allows raven to see request a.ID again after its
// accepted attempt a, or "" for none.
func (w *World) excused(a Attempt) string {
	if !a.Answered {
		return "raven's answer never reached " + a.Instance
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	in := w.byName(a.Instance)
	var seq uint64
	for _, st := range w.queue.Added() {
		if st.ID == a.ID {
			seq = st.Seq
		}
	}
	landed := time.Time{}
	for _, d := range w.deletes[seq] {
		if d.in != a.Instance {
			continue
		}
		if d.keep {
			// Keeping the final event in the queue is the removal's first write.
			if d.failed {
				return "keeping its final event, its removal's first write, failed"
			}
			if !d.landed.IsZero() && d.landed.Sub(d.called) > 50*time.Millisecond {
				return "keeping its final event, its removal's first write, was slow"
			}
			continue
		}
		if d.failed {
			return "its removal failed"
		}
		if !d.landed.IsZero() && (landed.IsZero() || d.landed.Before(landed)) {
			landed = d.landed
			if d.landed.Sub(d.called) > 50*time.Millisecond {
				return "its removal was slow"
			}
		}
	}
	if k, ok := w.kills[a.Instance]; ok && (landed.IsZero() || k.Before(landed)) {
		return a.Instance + " was killed before its removal"
	}
	if in != nil && in.pausedWithin(a.End, cmp.Or(landed, time.Now())) {
		return a.Instance + " was paused before its removal"
	}
	return ""
}

// removals lists the removals of request seq that landed: by whom, when called and when
// landed.
func (w *World) removals(seq uint64, at func(time.Time) string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, d := range w.deletes[seq] {
		if !d.keep && !d.landed.IsZero() {
			out = append(out, fmt.Sprintf("%s called at %s, landed at %s", d.in, at(d.called), at(d.landed)))
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, "; ")
}

func (w *World) removedAt(id, by string, at func(time.Time) string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, st := range w.queue.Added() {
		if st.ID != id {
			continue
		}
		for _, d := range w.deletes[st.Seq] {
			if d.in == by && !d.keep && !d.landed.IsZero() {
				return fmt.Sprintf("%s (called at %s)", at(d.landed), at(d.called))
			}
		}
	}
	return "never"
}
