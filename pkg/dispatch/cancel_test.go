package dispatch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/lease"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// hookedSource is a memSource that calls afterHead once a Head has read the head, and
// afterFind once a Find has looked: the moment a cancel and a worker cross.
type hookedSource struct {
	*memSource
	afterHead, afterFind func()
}

func (h *hookedSource) Head(ctx context.Context, lane request.Lane) (request.Stored, bool, error) {
	st, ok, err := h.memSource.Head(ctx, lane)
	if h.afterHead != nil {
		h.afterHead()
	}
	return st, ok, err
}

func (h *hookedSource) Find(ctx context.Context, lane request.Lane, id string) (request.Stored, bool, error) {
	st, ok, err := h.memSource.Find(ctx, lane, id)
	if h.afterFind != nil {
		h.afterFind()
	}
	return st, ok, err
}

// recordingEvents is an event writer that keeps what it was given, in order.
type recordingEvents struct {
	mu     sync.Mutex
	events []request.Event
	fail   bool // WriteNow says it did not write
}

func (e *recordingEvents) Record(ev request.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, ev)
}

func (e *recordingEvents) WriteNow(_ context.Context, ev request.Event) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.fail {
		return false
	}
	e.events = append(e.events, ev)
	return true
}

func (e *recordingEvents) types() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, ev := range e.events {
		out = append(out, string(ev.Type)+":"+ev.ID)
	}
	return out
}

// setupHooked is setup on a hookedSource.
func setupHooked(t *testing.T, cfg Config) (*bundle, *hookedSource) {
	t.Helper()
	b := setup(t, cfg)
	h := &hookedSource{memSource: b.src}
	d, err := New(b.d.cfg, h, b.snd, zerolog.New(b.log))
	if err != nil {
		t.Fatal(err)
	}
	d.now, d.rand = b.clock.now, func() float64 { return 0.5 }
	b.d = d
	return b, h
}

// owned is what the loop says of a partition this instance owns without a lease, taken
// over long ago.
var owned = ownAnswer{open: true, since: start.Add(-time.Hour)}

func TestCancelRemovesAQueuedRequestUnsent(t *testing.T) {
	t.Parallel()
	ev := &recordingEvents{}
	b := setup(t, Config{Events: ev})
	subj := laneOf(1, "alice")
	r1 := b.src.add(subj, "r1", start)
	b.src.add(subj, "r2", start)
	ctx := context.Background()

	res, err := b.d.cancel(ctx, subj, "r2", owned)
	if err != nil || res.Outcome != Cancelled || res.Request.ID != "r2" || res.Request.ClientID != "alice" {
		t.Fatalf("cancel of r2 behind the head: %+v, %v; want cancelled", res, err)
	}
	if got := b.src.ids(); !slices.Equal(got, []string{"r1"}) {
		t.Fatalf("queue after the cancel: %v; want r1 only", got)
	}
	if got := ev.types(); !slices.Equal(got, []string{"cancelled:r2"}) {
		t.Fatalf("events: %v; want r2's cancelled event, written before its removal", got)
	}
	if got := b.src.deadLetters(); len(got) != 0 {
		t.Fatalf("a cancel dead-letters nothing; dead letters: %v", sortedIDs(got))
	}
	if r := b.d.work(ctx, b.job(subj), time.Time{}); r.Kind != schedule.Delivered {
		t.Fatalf("r1 after r2's cancel: %v; want delivered", r.Kind)
	}
	if r := b.d.work(ctx, b.job(subj), time.Time{}); r.Kind != schedule.Empty {
		t.Fatalf("after r1, the queue: %v; want empty", r.Kind)
	}
	for _, a := range b.snd.attempts() {
		if a.id != r1.ID {
			t.Fatalf("raven received %s; only r1 was to go", a.id)
		}
	}
	res, err = b.d.cancel(ctx, subj, "r2", owned)
	if err != nil || res.Outcome != CancelNotQueued {
		t.Fatalf("cancel of r2 again: %+v, %v; want not queued", res, err)
	}
	res, err = b.d.cancel(ctx, subj, "r1", owned)
	if err != nil || res.Outcome != CancelNotQueued {
		t.Fatalf("cancel of r1, delivered: %+v, %v; want not queued", res, err)
	}
}

// With the events not taking writes, the cancelled event is kept in the queue before the
// removal (G10 across a crash, as for a delivery).
func TestCancelKeepsItsEventWhenTheEventsDoNotTakeIt(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Events: &recordingEvents{fail: true}})
	subj := laneOf(2, "bob")
	b.src.add(subj, "r1", start)
	res, err := b.d.cancel(context.Background(), subj, "r1", owned)
	if err != nil || res.Outcome != Cancelled {
		t.Fatalf("cancel: %+v, %v", res, err)
	}
	if len(b.src.kept) != 1 || b.src.kept[0].Type != request.EventCancelled || b.src.kept[0].ID != "r1" {
		t.Fatalf("kept in the queue: %+v; want r1's cancelled event", b.src.kept)
	}
	// And when neither takes it, nothing is removed and nothing is called cancelled.
	b.src.add(subj, "r2", start)
	b.src.keepFails = 1000
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if res, err := b.d.cancel(ctx, subj, "r2", owned); err == nil {
		t.Fatalf("cancel with neither the events nor the queue taking its event: %+v; want an error", res)
	}
	if got := b.src.ids(); !slices.Equal(got, []string{"r2"}) {
		t.Fatalf("queue: %v; r2 must stay", got)
	}
}

// Cancels of one request at once: one removes it and answers cancelled, the others wait
// for it and find it gone (not queued). Each found it in the queue before, removed it
// again and answered cancelled too (an operators'-side hostile-input pass: four at once
// over ten requests answered cancelled 18 times, and counted so).
func TestCancelsOfOneRequestAtOnceCancelItOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ev := &recordingEvents{}
		b, h := setupHooked(t, Config{Events: ev})
		subj := laneOf(1, "alice")
		b.src.add(subj, "r1", start)
		found := make(chan struct{})
		release := make(chan struct{})
		var first atomic.Bool
		h.afterFind = func() { // the first cancel, once it found r1, waits for the others
			if first.CompareAndSwap(false, true) {
				close(found)
				<-release
			}
		}
		const n = 4
		outcomes := make(chan CancelOutcome, n)
		go func() {
			res, err := b.d.cancel(t.Context(), subj, "r1", owned)
			if err != nil {
				t.Error(err)
			}
			outcomes <- res.Outcome
		}()
		<-found
		for range n - 1 {
			go func() {
				res, err := b.d.cancel(t.Context(), subj, "r1", owned)
				if err != nil {
					t.Error(err)
				}
				outcomes <- res.Outcome
			}()
		}
		synctest.Wait() // the others are under way: waiting, or (before) finding r1 too
		close(release)
		count := map[CancelOutcome]int{}
		for range n {
			count[<-outcomes]++
		}
		if count[Cancelled] != 1 || count[CancelNotQueued] != n-1 {
			t.Fatalf("%d cancels of r1 at once answered %v; want one cancelled, the others not queued", n, count)
		}
		if got := ev.types(); !slices.Equal(got, []string{"cancelled:r1"}) {
			t.Fatalf("events %v; want one cancelled event", got)
		}
	})
}

func TestCancelOfTheRequestInFlightIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	subj := laneOf(1, "alice")
	b.src.add(subj, "r1", start)
	b.src.add(subj, "r2", start)
	sending, release := make(chan struct{}), make(chan struct{})
	b.snd.answer = func(st request.Stored, _ int) error {
		close(sending)
		<-release
		return nil
	}
	done := make(chan schedule.Result)
	go func() { done <- b.d.work(context.Background(), b.job(subj), time.Time{}) }()
	<-sending
	res, err := b.d.cancel(context.Background(), subj, "r1", owned)
	if err != nil || res.Outcome != CancelInFlight {
		t.Fatalf("cancel of r1 while raven has it: %+v, %v; want in flight", res, err)
	}
	// The request behind it is not in flight: its cancel goes ahead meanwhile.
	res, err = b.d.cancel(context.Background(), subj, "r2", owned)
	if err != nil || res.Outcome != Cancelled {
		t.Fatalf("cancel of r2 while r1 is in flight: %+v, %v; want cancelled", res, err)
	}
	close(release)
	if r := <-done; r.Kind != schedule.Delivered {
		t.Fatalf("r1's attempt: %v; want delivered", r.Kind)
	}
	if got := b.src.ids(); len(got) != 0 {
		t.Fatalf("queue: %v; want empty", got)
	}
}

// A worker that read the request at the head before a cancel removed it does not send
// it: the cancel's generation moved on. Without it, raven received a cancelled request.
func TestWorkerThatReadTheHeadBeforeACancelDoesNotSendIt(t *testing.T) {
	t.Parallel()
	b, h := setupHooked(t, Config{})
	subj := laneOf(3, "carol")
	b.src.add(subj, "r1", start)
	var res CancelResult
	var cerr error
	h.afterHead = func() {
		h.afterHead = nil
		res, cerr = b.d.cancel(context.Background(), subj, "r1", owned) // lands between the head read and the send
	}
	r := b.d.work(context.Background(), b.job(subj), time.Time{})
	if cerr != nil || res.Outcome != Cancelled {
		t.Fatalf("cancel: %+v, %v; want cancelled", res, cerr)
	}
	if got := b.snd.attempts(); len(got) != 0 {
		t.Fatalf("raven received %v after its cancel was answered", got)
	}
	if r.Kind != schedule.Failed {
		t.Fatalf("the worker's job: %v; want failed (read the head again)", r.Kind)
	}
	if r := b.d.work(context.Background(), b.job(subj), time.Time{}); r.Kind != schedule.Empty {
		t.Fatalf("the next job: %v; want empty", r.Kind)
	}
}

// A worker that commits while a cancel of its request is under way (looking for it, its
// removal not landed yet) does not send it either.
func TestWorkerDoesNotSendARequestBeingCancelled(t *testing.T) {
	t.Parallel()
	b, h := setupHooked(t, Config{})
	subj := laneOf(3, "dave")
	b.src.add(subj, "r1", start)
	var r schedule.Result
	h.afterFind = func() {
		h.afterFind = nil
		r = b.d.work(context.Background(), b.job(subj), time.Time{}) // the whole job, mid-cancel
	}
	res, err := b.d.cancel(context.Background(), subj, "r1", owned)
	if err != nil || res.Outcome != Cancelled {
		t.Fatalf("cancel: %+v, %v; want cancelled", res, err)
	}
	if got := b.snd.attempts(); len(got) != 0 {
		t.Fatalf("raven received %v while it was being cancelled", got)
	}
	if r.Kind != schedule.Failed {
		t.Fatalf("the worker's job: %v; want failed", r.Kind)
	}
}

// Only the owner decides, and not while an earlier owner's attempt may be under way;
// and a removal that lands after the lease could have lapsed is not called a cancel.
func TestCancelDecidesOnlyWhileSurelyTheOwner(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Leases: leasesOnly{}, LeaseTTL: testTTL, SendTimeout: time.Second})
	subj := laneOf(0, "erin")
	b.src.add(subj, "r1", start)
	ctx := context.Background()
	now := b.clock.now()
	for _, c := range []struct {
		name string
		own  ownAnswer
		want CancelOutcome
	}{
		{"not owned", ownAnswer{}, CancelNotOwner},
		{"lease lapsed", ownAnswer{open: true, since: now.Add(-time.Hour), validUntil: now}, CancelNotOwner},
		{"fence ahead", ownAnswer{open: true, since: now.Add(time.Second), validUntil: now.Add(time.Minute)}, CancelHandover},
	} {
		res, err := b.d.cancel(ctx, subj, "r1", c.own)
		if err != nil || res.Outcome != c.want {
			t.Fatalf("%s: %+v, %v; want %v", c.name, res, err, c.want)
		}
		if c.want == CancelHandover && !res.Until.Equal(c.own.since) {
			t.Fatalf("%s: until %s; want the fence %s", c.name, res.Until, c.own.since)
		}
	}
	if got := b.src.ids(); !slices.Equal(got, []string{"r1"}) {
		t.Fatalf("queue: %v; nothing decided, r1 stays", got)
	}
	// The clock passes the lease (and its margin) while the removal is made.
	h := &hookedSource{memSource: b.src, afterFind: func() { b.clock.advance(time.Hour) }}
	b.d.src = h
	_, err := b.d.cancel(ctx, subj, "r1", ownAnswer{open: true, since: now.Add(-time.Hour), validUntil: now.Add(time.Second)})
	if !errors.Is(err, ErrCancelLate) {
		t.Fatalf("a removal landing after the lease: %v; want ErrCancelLate", err)
	}
}

// markNow marks id of lane as a cancel does, with no other cancel of it under way.
func markNow(s *sending, lane request.Lane, id string) (inFlight bool) {
	inFlight, _, _ = s.mark(context.Background(), lane, id)
	return inFlight
}

// The sending guard's own rules, each crossing of a commit and a cancel.
func TestSendingGuard(t *testing.T) {
	t.Parallel()
	s := newSending()
	g := s.look()
	if !s.commit(request.Lane{Token: "a"}, "r1", g) {
		t.Fatal("a commit with no cancel about is refused")
	}
	if !markNow(s, request.Lane{Token: "a"}, "r1") {
		t.Fatal("a cancel of the request committed to is not told it is in flight")
	}
	if markNow(s, request.Lane{Token: "a"}, "r2") {
		t.Fatal("a cancel of another request of the client is told it is in flight")
	}
	s.settled(request.Lane{Token: "a"})
	if s.commit(request.Lane{Token: "a"}, "r2", s.look()) {
		t.Fatal("a commit to a request being cancelled is let through")
	}
	g = s.look()
	s.unmark(request.Lane{Token: "a"}, "r2")
	if s.commit(request.Lane{Token: "a"}, "r2", g) {
		t.Fatal("a commit by a worker that looked before the cancel let go is let through")
	}
	// Another client's cancel does not hold a send back (G6): a worker of client b that
	// looked before a cancel of a's request commits all the same.
	g = s.look()
	if markNow(s, request.Lane{Token: "a"}, "r4") {
		t.Fatal("a cancel of a request not committed to is told it is in flight")
	}
	s.unmark(request.Lane{Token: "a"}, "r4")
	if !s.commit(request.Lane{Token: "b"}, "r9", g) {
		t.Fatal("a cancel of client a's request refused client b's send")
	}
	s.settled(request.Lane{Token: "b"})
	// A worker that looked before every mark remembered cannot tell: it is refused.
	g = s.look()
	for i := range maxLetGo + 1 {
		markNow(s, request.Lane{Token: "a"}, fmt.Sprint("x", i))
		s.unmark(request.Lane{Token: "a"}, fmt.Sprint("x", i))
	}
	if s.commit(request.Lane{Token: "b"}, "r10", g) {
		t.Fatal("a commit that looked before the marks remembered is let through")
	}
	if !s.commit(request.Lane{Token: "a"}, "r3", s.look()) {
		t.Fatal("a commit after the cancel, looked at afresh, is refused")
	}
}

// blockedEvents is an event writer whose WriteNow waits until it is let through.
type blockedEvents struct {
	recordingEvents
	open    chan struct{}
	through func() // lets WriteNow through; once is enough
}

func newBlockedEvents() *blockedEvents {
	e := &blockedEvents{open: make(chan struct{})}
	e.through = sync.OnceFunc(func() { close(e.open) })
	return e
}

func (e *blockedEvents) WriteNow(ctx context.Context, ev request.Event) bool {
	<-e.open
	return e.recordingEvents.WriteNow(ctx, ev)
}

// blockedCancel is a loop run as Run runs it (serve, then drain), with a cancel of r1 in
// partition 1 under way: waiting for its event's write until ev.through. served is
// closed once drain returned, when Run would release the leases.
type blockedCancel struct {
	l        *loop
	ev       *blockedEvents
	stop     context.CancelFunc
	served   chan struct{}
	answered chan CancelResult
}

// startBlockedCancel starts it in the test's bubble; the cleanup it returns leaves
// nothing blocked there, whatever failed.
func startBlockedCancel(t *testing.T) (*blockedCancel, func()) {
	ev := newBlockedEvents()
	b := setup(t, Config{Events: ev})
	l := newTestLoop(t, b)
	ownAll(b, l)
	subj := laneOf(1, "alice")
	b.src.add(subj, "r1", start)
	ctx, stop := context.WithCancel(context.Background())
	c := &blockedCancel{l: l, ev: ev, stop: stop, served: make(chan struct{}), answered: make(chan CancelResult, 1)}
	go func() { l.serve(ctx); l.drain(); close(c.served) }()
	go func() {
		res, err := b.d.Cancel(context.Background(), subj, "r1")
		if err != nil {
			t.Error(err)
		}
		c.answered <- res
	}()
	synctest.Wait() // the cancel waits for its event's write
	return c, func() { ev.through(); stop(); <-c.served }
}

// letThrough lets the cancel's event be written, and checks it answered cancelled.
func (c *blockedCancel) letThrough(t *testing.T) {
	t.Helper()
	c.ev.through()
	if res := <-c.answered; res.Outcome != Cancelled {
		t.Fatalf("the cancel: %+v, want cancelled", res)
	}
	synctest.Wait()
}

// closed says whether ch is closed now.
func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A partition is not handed back while a cancel there may still remove a request: the
// instance taking it over saw the hand-back and sends at once, so a cancel that removed
// the request after the hand-back and answered cancelled could have been sent first
// (the simulation's seed 890, under load: an instance left while its cancel waited for
// the cancelled event's write). A partition taken again while the cancel runs (its lease
// lost and acquired anew) carries the hold into the new tenure, as it carries the
// attempts in flight.
func TestAHandBackWaitsForACancelUnderWay(t *testing.T) {
	t.Parallel()
	for _, takenAgain := range []bool{false, true} {
		t.Run(fmt.Sprint("taken again ", takenAgain), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				c, cleanup := startBlockedCancel(t)
				defer cleanup()
				if takenAgain {
					c.l.events <- lease.Event{Kind: lease.Acquired, Partition: 1}
				}
				handedBack := make(chan struct{})
				c.l.events <- lease.Event{Kind: lease.Release, Partition: 1, Done: handedBack}
				synctest.Wait()
				if closed(handedBack) {
					t.Fatal("partition 1 was handed back while a cancel there could still remove r1")
				}
				c.letThrough(t)
				if !closed(handedBack) {
					t.Fatal("partition 1 was not handed back once the cancel was done")
				}
			})
		})
	}
}

// At shutdown too, the leases are released (after drain) only once a cancel under way is
// done.
func TestShutdownWaitsForACancelUnderWay(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c, cleanup := startBlockedCancel(t)
		defer cleanup()
		c.stop()
		synctest.Wait()
		if closed(c.served) {
			t.Fatal("drained, so the leases would be released, while a cancel could still remove r1")
		}
		c.letThrough(t)
		if !closed(c.served) {
			t.Fatal("not drained once the cancel was done")
		}
	})
}

// A cancel lets go of its hold on the partition and nothing more: the partition stays
// this instance's, and its lanes go on (the simulation's 18,000 stalled requests when a
// cancel's end let go of the whole partition).
func TestACancelLeavesItsPartitionOwned(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, Config{Events: &recordingEvents{}})
		l := newTestLoop(t, b)
		ownAll(b, l)
		subj := laneOf(1, "alice")
		b.src.add(subj, "r1", start)
		b.src.add(subj, "r2", start)
		ctx, stop := context.WithCancel(context.Background())
		served := make(chan struct{})
		go func() { l.serve(ctx); l.drain(); close(served) }()
		defer func() { stop(); <-served }()
		if res, err := b.d.Cancel(context.Background(), subj, "r2"); err != nil || res.Outcome != Cancelled {
			t.Fatalf("cancel of r2: %+v, %v", res, err)
		}
		synctest.Wait()
		if st := b.d.Stats(); st.Owned != b.src.Partitions() {
			t.Fatalf("after a cancel the loop owns %d partitions, want all %d", st.Owned, b.src.Partitions())
		}
	})
}
