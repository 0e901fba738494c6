package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/tracing"
)

// A cancel removes a queued request that is not in flight, unsent (issue 31, ADR 13).
// Its promise: once Cancel says Cancelled, raven never receives the request. Only the
// instance that owns the client's partition decides, as it alone may start attempts
// there:
//
//   - Attempts of an earlier owner: the partition's fence (since) is when they have all
//     ended. Before it, Cancel says CancelHandover and decides nothing.
//   - Attempts of a later owner: the removal must land while this instance's lease is
//     surely valid (validUntil plus the margin, as a delivery's removal); a later owner
//     reads the client's queue only after that, and finds the request gone. One that
//     lands later is not called a cancel.
//   - Attempts of this instance: the sending guard below.

// sending keeps a cancel and an attempt of the same request apart on one instance. A
// worker commits to the request it read at its client's head just before it sends it
// (or dead-letters it unsent); a cancel marks the request before it looks for it in the
// queue, and holds the mark until its removal has landed:
//
//   - a commit made before the mark: the cancel sees it, and says CancelInFlight;
//   - a commit tried while the mark is held: refused, the worker reads the head again;
//   - a commit tried after the mark is gone, by a worker that read the head before the
//     removal landed: refused too, as the generation it read before its head read has
//     moved on (the cancel moves it on as it lets the mark go) by a cancel of its own
//     client (another client's cancel leaves its send alone).
type sending struct {
	gen        atomic.Uint64 // moved on under mu; read without it by look
	mu         sync.Mutex
	attempting map[request.Lane]string // lane: id of the request committed to
	// cancelling: the ids being cancelled, each with a channel closed when its cancel
	// lets its mark go.
	cancelling map[string]chan struct{}
	// let go: the lanes of the last marks let go, with the generation each moved to,
	// oldest first. A commit is refused only for its own client's cancels (another
	// client's must not hold its send back, G6); one that looked before all of these
	// cannot tell, and is refused.
	letGo []letGo
}

type letGo struct {
	lane request.Lane
	gen  uint64
}

// maxLetGo is how many marks let go sending remembers: cancels are rare, and a worker
// commits within about a lead of its look.
const maxLetGo = 256

func newSending() *sending {
	return &sending{attempting: map[request.Lane]string{}, cancelling: map[string]chan struct{}{}}
}

// look is the generation, read by a worker before it reads its client's head (every
// attempt's path: no lock).
func (s *sending) look() uint64 { return s.gen.Load() }

// commit says whether the worker that read gen before reading request id at lane's
// head may send it (or dead-letter it): no cancel marked it, nor let a mark of its
// client go since.
func (s *sending) commit(lane request.Lane, id string, gen uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, marked := s.cancelling[id]; marked || s.gen.Load() != gen && s.cancelledSince(lane, gen) {
		return false
	}
	s.attempting[lane] = id
	return true
}

// cancelledSince says whether a mark on lane was let go after generation gen, or
// may have been (the memory of marks let go does not reach back that far).
func (s *sending) cancelledSince(lane request.Lane, gen uint64) bool {
	if len(s.letGo) == 0 || s.letGo[0].gen > gen+1 {
		return true
	}
	for _, l := range s.letGo {
		if l.gen > gen && l.lane == lane {
			return true
		}
	}
	return false
}

// settled ends lane's commit: its request was delivered, dead-lettered or will be
// retried.
func (s *sending) settled(lane request.Lane) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.attempting, lane)
}

// mark marks request id of lane as being cancelled, unless an attempt of it is
// committed to (inFlight). One cancel of a request at a time: one under way here is
// waited for first (while ctx lasts), so that the second finds the request gone (not
// queued) instead of finding it too, removing it again and answering cancelled as well
// (four cancels of one request at once answered cancelled four times, and counted so).
// waited says whether it waited: the caller's look at its ownership is then older.
func (s *sending) mark(ctx context.Context, lane request.Lane, id string) (inFlight, waited bool, err error) {
	for {
		s.mu.Lock()
		busy, other := s.cancelling[id]
		if !other {
			defer s.mu.Unlock()
			if s.attempting[lane] == id {
				return true, waited, nil
			}
			s.cancelling[id] = make(chan struct{})
			return false, waited, nil
		}
		s.mu.Unlock()
		waited = true
		select {
		case <-busy:
		case <-ctx.Done():
			return false, waited, fmt.Errorf("waiting for another cancel of the same request: %w", ctx.Err())
		}
	}
}

// unmark lets the mark on request id of lane go, once the cancel's removal landed
// (or failed).
func (s *sending) unmark(lane request.Lane, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if busy, ok := s.cancelling[id]; ok {
		close(busy)
		delete(s.cancelling, id)
	}
	if len(s.letGo) == maxLetGo {
		s.letGo = append(s.letGo[:0], s.letGo[1:]...)
	}
	s.letGo = append(s.letGo, letGo{lane: lane, gen: s.gen.Add(1)})
}

// CancelOutcome says how a cancel ended.
type CancelOutcome int

const (
	// CancelNotOwner: this instance does not own the client's partition now, or its
	// lease could lapse before a removal lands. It decides nothing; the owner does.
	CancelNotOwner CancelOutcome = iota
	// Cancelled: the request left the queue unsent, and raven never receives it.
	Cancelled
	// CancelInFlight: an attempt of the request is under way (or it is being
	// dead-lettered unsent); raven may receive it.
	CancelInFlight
	// CancelNotQueued: the request is not in its client's queue: it ended already
	// (delivered, dead-lettered, cancelled), or was never accepted.
	CancelNotQueued
	// CancelHandover: the partition changed hands lately, and an attempt by its earlier
	// owner may still be under way until CancelResult.Until.
	CancelHandover
)

func (o CancelOutcome) String() string {
	switch o {
	case Cancelled:
		return request.CancelCancelled
	case CancelInFlight:
		return request.CancelInFlight
	case CancelNotQueued:
		return request.CancelNotQueued
	case CancelHandover:
		return request.CancelHandover
	}
	return "not_owner"
}

// CancelResult is a cancel's answer.
type CancelResult struct {
	Outcome CancelOutcome
	// Request is the request cancelled (no body), for Cancelled.
	Request request.Stored
	// At is when it was cancelled (its cancelled event's time), for Cancelled.
	At time.Time
	// Until is when an earlier owner's attempts have surely ended, for CancelHandover.
	Until time.Time
}

// ErrCancelLate is Cancel's error when the removal landed, but only after the
// partition's lease could have lapsed: a later owner may have read the request first,
// so it is not called cancelled. Its status says what became of it.
var ErrCancelLate = errors.New("the removal landed after this dispatcher's lease could have lapsed; read the request's status")

// ownAsk asks the loop about the partition of a lane.
type ownAsk struct {
	lane  request.Lane
	reply chan ownAnswer
}

type ownAnswer struct {
	open              bool
	since, validUntil time.Time
	held              bool // the partition is held for the cancel until it is done (cancelsDone)
}

// holdForCancel answers a cancel that asks about lane's partition. When attempts may start
// there, the partition is held for the cancel, as for an attempt in flight: not handed
// back, nor let go of at shutdown, until the cancel is done. Released while the cancel
// could still remove the request, a later owner could send it first.
func (l *loop) holdForCancel(lane request.Lane) ownAnswer {
	_, part := l.owner(lane)
	if part == nil {
		return ownAnswer{}
	}
	part.cancels++
	l.cancelsHeld++
	return ownAnswer{open: true, since: part.since, validUntil: part.validUntil, held: true}
}

// cancelDone lets go of a cancel's hold on partition p (the tenure that holds it now: a
// new one carries the holds of the one before), which is handed back or let go of now if
// that waited for it.
func (l *loop) cancelDone(p int) {
	l.cancelsHeld--
	part := l.owned[p]
	if part == nil {
		return
	}
	part.cancels--
	if !part.open() {
		l.dropIfDrained(p, part)
	}
}

// Cancel removes request id from lane's queue, unsent, if it is queued and not in
// flight, and only if this instance owns the client's partition (CancelNotOwner: ask
// the owner). Its cancelled event is written before the removal, or kept in the queue
// with it (G10, ADR 9). An error says nothing was decided, except ErrCancelLate.
func (d *Dispatcher) Cancel(ctx context.Context, lane request.Lane, id string) (CancelResult, error) {
	own, err := d.askOwner(ctx, lane)
	if err != nil {
		return CancelResult{}, err
	}
	if own.held {
		defer func() { d.cancelsDone <- lane.Partition }() // the loop reads it until every hold is let go of
	}
	res, err := d.cancel(ctx, lane, id, own)
	if err == nil && res.Outcome != CancelNotOwner {
		d.cfg.Metrics.cancel(res.Outcome.String())
	}
	return res, err
}

func (d *Dispatcher) cancel(ctx context.Context, lane request.Lane, id string, own ownAnswer) (CancelResult, error) {
	now := d.now()
	switch {
	case !own.open || lapsed(own.validUntil, now):
		return CancelResult{Outcome: CancelNotOwner}, nil
	case now.Before(own.since):
		return CancelResult{Outcome: CancelHandover, Until: own.since}, nil
	}
	inFlight, waited, err := d.sending.mark(ctx, lane, id)
	switch {
	case err != nil:
		return CancelResult{}, err
	case inFlight:
		return CancelResult{Outcome: CancelInFlight}, nil
	}
	defer d.sending.unmark(lane, id)
	if waited && lapsed(own.validUntil, d.now()) { // the look at the ownership is older than the wait
		return CancelResult{Outcome: CancelNotOwner}, nil
	}
	// Surely valid until: the removal must land by then (see above).
	by := time.Time{}
	if !own.validUntil.IsZero() {
		by = own.validUntil.Add(d.cfg.leaseMargin())
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, by)
		defer cancel()
	}
	st, ok, err := d.src.Find(ctx, lane, id)
	if err != nil {
		return CancelResult{}, fmt.Errorf("looking for %s in its client's queue: %w", id, err)
	}
	if !ok {
		return CancelResult{Outcome: CancelNotQueued}, nil
	}
	at := d.now() // the event's time, and the answer's: a status read later says the same
	var unwritten *request.Event
	if d.cfg.Events != nil {
		ev := eventOf(st, request.EventCancelled)
		ev.At = at
		unwritten = d.writeNow(ctx, ev, own.validUntil)
	}
	if err := notQueuedIsDone(d.keepThenDelete(st, unwritten)(ctx)); err != nil {
		return CancelResult{}, fmt.Errorf("removing %s from its client's queue: %w", id, err)
	}
	if !by.IsZero() && d.now().After(by) {
		d.log.Warn().Str("client_id", st.ClientID).Str("request_id", st.ID).Msg("cancelled request removed only after the partition's lease could have lapsed; not answered as cancelled")
		return CancelResult{}, ErrCancelLate
	}
	d.log.Info().Str("client_id", st.ClientID).Str("request_id", st.ID).Func(tracing.Log(st.TraceParent)).Msg("request cancelled; it left the queue unsent")
	return CancelResult{Outcome: Cancelled, Request: st, At: at}, nil
}

// askOwner asks the loop whether lane's partition is this instance's, and holds it for
// the cancel when it is. The loop answers an ask it took at once, so the answer is
// always taken: a hold is never left behind.
func (d *Dispatcher) askOwner(ctx context.Context, lane request.Lane) (ownAnswer, error) {
	q := ownAsk{lane: lane, reply: make(chan ownAnswer, 1)}
	select {
	case d.owns <- q:
	case <-ctx.Done():
		return ownAnswer{}, fmt.Errorf("dispatcher did not answer: %w", ctx.Err())
	}
	return <-q.reply, nil
}
