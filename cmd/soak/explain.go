package main

import (
	"time"

	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/ledger"
	"github.com/penguinhq/dispatcher/pkg/raven"
)

// explain finds, for every request that may have been delivered twice, the cause on
// record: a dispatcher's log line (a removal that failed or landed late, an attempt
// given up on, an attempt that failed although raven had answered it 2xx: the answer was
// lost) or a SIGKILL of the instance that had it delivered, before it could remove it.
// timedOut is the attempts (ledger.TimedOutKey) the dispatchers gave up on for want of
// raven's answer: they ended for the sender before raven may have finished them, so the
// ledger measures the next attempt from their start only.
func (s *soak) explain() (causes map[string]string, timedOut map[string]bool) {
	arrivals := s.raven.Arrivals()
	accepted := map[string]map[int]bool{} // id -> attempt numbers raven answered 2xx
	for _, a := range arrivals {
		if a.Status >= 200 && a.Status < 300 && a.StatusSent {
			if accepted[a.ID] == nil {
				accepted[a.ID] = map[int]bool{}
			}
			accepted[a.ID][a.Attempt] = true
		}
	}
	causes, timedOut = map[string]string{}, map[string]bool{}
	for _, d := range append(append([]*service{}, s.dispatchers...), s.retired...) {
		for _, l := range d.p.LogLines(dispatch.LogRemovalFailed, dispatch.LogRemovalLate, dispatch.LogAttemptFailed) {
			id, _ := l["request_id"].(string)
			msg, _ := l["message"].(string)
			cause, _ := l["error"].(string)
			attempt, _ := l["attempt"].(float64)
			if id != "" && msg == dispatch.LogAttemptFailed && raven.TimedOutText(cause) {
				timedOut[ledger.TimedOutKey(id, int(attempt))] = true
			}
			switch {
			case id == "":
			case msg == dispatch.LogRemovalFailed:
				causes[id] = "removal failed at first (store or link down)"
			case msg == dispatch.LogRemovalLate:
				causes[id] = "removal landed after the lease could lapse (paused)"
			case raven.TimedOutText(cause) && accepted[id][int(attempt)]:
				if _, ok := causes[id]; !ok {
					causes[id] = "attempt timed out; raven accepted it all the same"
				}
			case accepted[id][int(attempt)]:
				// Raven answered 2xx and the answer was lost on the way: the connection was
				// cut (a fault's proxy resetting it) after raven had written it.
				if _, ok := causes[id]; !ok {
					causes[id] = "raven accepted it, its answer was lost (connection cut)"
				}
			}
		}
	}
	// A request the killed dispatcher had sent (raven said 2xx) and that was sent again
	// only after the kill, by another: its removal had not landed. The removal follows
	// the answer at once on an idle machine; on a loaded one (two CI runs side by side)
	// removals waited on the store for more than the raven timeout and two seconds, so
	// the window is generous, and the causal part is that the next send came after the
	// kill from another instance.
	for _, k := range s.kills {
		for i, a := range arrivals {
			if _, ok := causes[a.ID]; !ok && killedBeforeRemoval(arrivals, i, k) {
				causes[a.ID] = "dispatcher killed before removing it"
			}
		}
	}
	return causes, timedOut
}

// killedBeforeRemoval says whether arrivals[i] is a delivery by the killed dispatcher k
// whose removal the kill may have cut short: raven answered it 2xx, it was sent up to
// killRemovalWindow before the kill, or after it while its bytes were still on their way
// (until its links closed: an attempt written just before the kill reaches raven
// through its fault proxy a moment later), and another dispatcher sent it again after
// the kill.
func killedBeforeRemoval(arrivals []ledger.Arrival, i int, k kill) bool {
	a := arrivals[i]
	if a.Header.Get("User-Agent") != "dispatcher/"+k.id || a.Status >= 300 || !a.StatusSent {
		return false
	}
	last := k.gone
	if last.IsZero() {
		last = k.at
	}
	if a.Start.After(last) || !a.Start.After(k.at.Add(-killRemovalWindow)) {
		return false
	}
	return resentAfter(arrivals[i+1:], a.ID, k)
}

// killRemovalWindow is how long before a kill a killed dispatcher's delivery may still
// have been waiting for its removal.
const killRemovalWindow = 30 * time.Second

// resentAfter says whether the next arrival of id among later (arrivals in order of
// their start) came after kill k, from another dispatcher.
func resentAfter(later []ledger.Arrival, id string, k kill) bool {
	for _, b := range later {
		if b.ID == id {
			return b.Start.After(k.at) && b.Header.Get("User-Agent") != "dispatcher/"+k.id
		}
	}
	return false
}
