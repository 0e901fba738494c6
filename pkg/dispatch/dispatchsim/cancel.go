package dispatchsim

import (
	"context"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// cancelCall is a cancel that an instance answered Cancelled.
type cancelCall struct {
	id, client, by            string
	called, removed, answered time.Time
}

// cancelSteps are the run's cancels: up to sixteen, at times drawn over the faults, each of
// a request drawn from those queued then, from the heads of the clients' queues then, or
// from every request added (some come too late). They are drawn from a stream of their own, so that
// a seed's faults are those it had before cancels were simulated.
func (w *World) cancelSteps() []event {
	r := rand.New(rand.NewPCG(w.seed, 0xca9ce1))
	var steps []event
	for range r.IntN(17) {
		at, n, pool := time.Duration(r.Int64N(int64(w.set.Faults))), r.Uint64(), r.IntN(3)
		steps = append(steps, event{at: at, do: func() { go w.cancel(n, pool) }})
	}
	return steps
}

// cancel asks every live instance to cancel one request, as ingest's ask reaches them
// all; the owner of the request's client decides. Those that answer Cancelled are kept
// for the check.
func (w *World) cancel(n uint64, from int) {
	pool := w.queue.Queued()
	switch {
	case from == 0 || len(pool) == 0:
		pool = w.queue.Added()
	case from == 1:
		// The heads: the requests most likely in flight, perhaps with an earlier owner.
		seen := map[string]bool{}
		pool = slices.DeleteFunc(pool, func(st request.Stored) bool {
			head := !seen[st.Subject]
			seen[st.Subject] = true
			return !head
		})
	}
	if len(pool) == 0 {
		return
	}
	st := pool[n%uint64(len(pool))]
	called := time.Now()
	ctx, cancel := context.WithTimeout(w.ctx, 20*time.Second) // longer than any ask: the owner alone must keep its promise
	defer cancel()
	live := w.liveNow()
	type answer struct {
		in  *Instance
		res dispatch.CancelResult
		err error
	}
	answers := make(chan answer, len(live))
	for _, in := range live {
		go func() {
			res, err := in.d.Cancel(ctx, st.Lane, st.ID)
			answers <- answer{in, res, err}
		}()
	}
	for range live {
		a := <-answers
		if a.err != nil || a.res.Outcome == dispatch.CancelNotOwner {
			continue
		}
		w.note("%s answers the cancel of %s called at %.3fs: %s", a.in.name, st.ID, called.Sub(w.start).Seconds(), a.res.Outcome)
		w.mu.Lock()
		if w.cancelAnswers == nil {
			w.cancelAnswers = map[string]int{}
		}
		w.cancelAnswers[a.res.Outcome.String()]++
		w.mu.Unlock()
		if a.res.Outcome == dispatch.Cancelled {
			w.mu.Lock()
			w.cancelled = append(w.cancelled, cancelCall{id: st.ID, client: st.ClientID, by: a.in.name, called: called, removed: a.res.At, answered: time.Now()})
			w.mu.Unlock()
		}
	}
}

// checkCancels: once a cancel answered Cancelled, raven never receives the request; no
// attempt of it starts after the cancel was called (one under way then makes the cancel
// answer in flight, or handover). It returns when each request cancelled left the queue:
// neither delivered nor dead-lettered, by right.
func (w *World) checkCancels(attempts []Attempt, fail func(client, format string, args ...any), at func(time.Time) string) map[string]time.Time {
	w.mu.Lock()
	calls := append([]cancelCall(nil), w.cancelled...)
	w.mu.Unlock()
	first := map[string]cancelCall{}
	for _, c := range calls {
		if f, ok := first[c.id]; !ok || c.called.Before(f.called) {
			first[c.id] = c
		}
	}
	for _, a := range attempts {
		c, ok := first[a.ID]
		switch {
		case !ok:
		case !a.Start.Before(c.called):
			fail(a.Client, "cancel: raven received %s from %s at %s, after its cancel called at %s was answered cancelled by %s at %s",
				a.ID, a.Instance, at(a.Start), at(c.called), c.by, at(c.answered))
		case a.Accepted && w.excused(a) == "":
			// Raven accepted it before the cancel, and its sender knew and removed it in
			// time: the cancel should have found it in flight, or gone.
			fail(a.Client, "cancel: %s was accepted by raven from %s at %s, yet its cancel called at %s was answered cancelled by %s at %s",
				a.ID, a.Instance, at(a.AcceptedAt), at(c.called), c.by, at(c.answered))
		}
	}
	out := map[string]time.Time{}
	for id, c := range first {
		out[id] = c.removed
	}
	return out
}
