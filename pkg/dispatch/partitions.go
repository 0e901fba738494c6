package dispatch

import (
	"time"

	"github.com/penguinhq/dispatcher/pkg/lease"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// partition is what the loop knows of one partition it owns.
type partition struct {
	since      time.Time // when it became ours: no attempt starts before an interval after
	validUntil time.Time // no attempt starts after this (the lease could lapse)
	inFlight   int
	cancels    int           // this instance's cancels that may still remove a request here
	release    chan struct{} // closed once drained, when handing the partition back
	gone       bool          // the lease was lost; kept only until attempts in flight end
}

// open says whether new attempts may start in the partition.
func (p *partition) open() bool { return p != nil && p.release == nil && !p.gone }

// lapsed says whether a lease valid until validUntil (zero: no lease, never) could have
// lapsed by now: no attempt may start then.
func lapsed(validUntil, now time.Time) bool {
	return !validUntil.IsZero() && !now.Before(validUntil)
}

// take opens partition p to this loop's attempts from now, or from notBefore if that is
// later (the fence the leaser, which acquired its lease, times); the scheduler adds the
// interval.
func (l *loop) take(p int, now, validUntil, notBefore time.Time) {
	part := &partition{since: schedule.Later(now, notBefore), validUntil: validUntil}
	if old := l.owned[p]; old != nil {
		// Results and cancels of an earlier tenure still on their way.
		part.inFlight, part.cancels = old.inFlight, old.cancels
	}
	l.owned[p] = part
	l.watchOpen(p) // listed once the backlog watch covers it
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

func (l *loop) ownership(e lease.Event) {
	now := l.d.now()
	l.d.gov.PartitionsChanged() // raven's budget is shared by the partitions one may send for
	part := l.owned[e.Partition]
	switch e.Kind {
	case lease.Acquired:
		l.take(e.Partition, now, e.ValidUntil, e.NotBefore)
	case lease.Renewed:
		if part != nil {
			part.validUntil = e.ValidUntil
		}
	case lease.Lost:
		l.forget(e.Partition)
		if part != nil {
			part.gone = true
			l.dropIfDrained(e.Partition, part)
			l.watchOpen()
		}
	case lease.Release:
		if part == nil {
			close(e.Done)
			return
		}
		part.release = e.Done
		l.forget(e.Partition)
		l.dropIfDrained(e.Partition, part)
		l.watchOpen()
	}
}

// dropIfDrained lets go of partition p, closed to new attempts, once none is in flight
// there and no cancel of this instance may still remove a request there (a later owner
// that saw the hand-back sends at once, and must not send what a cancel then removes
// and answers as cancelled): a partition handed back is then released. Under an
// in-flight budget a hand-back
// also waits until this instance's attempts in flight are within its share without p,
// so that the one taking p over cannot take the sum over the budget.
func (l *loop) dropIfDrained(p int, part *partition) {
	if part.inFlight > 0 || part.cancels > 0 || l.owned[p] != part {
		return // attempts or cancels under way, or let go of already
	}
	if part.release != nil && l.d.gov.LimitsInFlight() {
		now := l.d.now()
		if l.d.gov.NeedsCount(now) {
			l.countOpen(now)
		}
		if l.d.gov.OverShare(l.sched.InFlight()) {
			l.releasing = true
			return
		}
	}
	if part.release != nil {
		close(part.release)
	}
	delete(l.owned, p)
}

// forget drops the waiting lanes of partition p; lanes in flight are dropped as they end.
func (l *loop) forget(p int) {
	l.sched.ForgetWaiting(func(lane request.Lane) bool { return lane.Partition == p })
}

// owner returns lane's partition and its state, the state only if attempts may start
// there.
func (l *loop) owner(lane request.Lane) (int, *partition) {
	p := lane.Partition
	if part := l.owned[p]; part.open() {
		return p, part
	}
	return p, nil
}

func (l *loop) notify(lane request.Lane) {
	if _, part := l.owner(lane); part != nil {
		l.sched.Notify(lane, l.d.now(), part.since)
	}
}

// done takes a finished attempt back: the lane goes on, unless its partition is no
// longer open to attempts.
func (l *loop) done(r finished) {
	now := l.d.now()
	l.sched.Done(r.Result, now)
	l.d.gov.Finished(r.Result, r.token, now)
	part := l.owned[r.partition]
	if part != nil {
		part.inFlight--
	}
	if l.releasing {
		l.releaseDrained()
	}
	if part.open() {
		return
	}
	l.d.gov.PartitionsChanged()
	l.sched.Forget(r.Lane)
	if part != nil {
		l.dropIfDrained(r.partition, part)
	}
}

// listOpen asks for a listing of the backlog of every partition open to attempts.
func (l *loop) listOpen() {
	for p, part := range l.owned {
		if part.open() {
			l.list(p)
		}
	}
}

// countOpen tells raven's budget how many partitions this instance may send for at now
// (open, and the lease not lapsed by this instance's clock), and when the first of those
// leases could lapse.
func (l *loop) countOpen(now time.Time) {
	n, until := 0, time.Time{}
	for _, part := range l.owned {
		if !part.open() || lapsed(part.validUntil, now) {
			continue
		}
		n++
		if !part.validUntil.IsZero() && (until.IsZero() || part.validUntil.Before(until)) {
			until = part.validUntil
		}
	}
	l.d.gov.Count(n, until, now)
}

// releaseDrained hands back the partitions that wait for this instance's attempts in
// flight to come within its share of raven's in-flight budget.
func (l *loop) releaseDrained() {
	l.releasing = false
	for p, part := range l.owned {
		if part.release != nil {
			l.dropIfDrained(p, part)
		}
	}
}
