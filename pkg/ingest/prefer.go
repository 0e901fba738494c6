package ingest

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// PreferenceAppliedHeader is on an answer to a POST that asked, with Prefer: wait=N
// (RFC 7240), to be held until the request reached a final state: "wait=N" with the
// seconds it was held for at most (N, or MAX_STATUS_WAIT when that is less). The answer is
// 200 with the status when the request got there in time, 202 as always when not.
const PreferenceAppliedHeader = "Preference-Applied"

// preferWait reads the wait preference of a POST's Prefer headers (RFC 7240): the
// seconds of "wait=N", false when there is none. Other preferences are ignored, as the
// RFC asks. Stricter than the RFC (which takes the first of a preference given twice
// and lets a malformed one be ignored): a wait that is not a whole number of seconds, or
// given twice, is a 400, checked before anything is stored, so that a caller that meant
// to wait learns it will not.
func preferWait(h http.Header) (time.Duration, bool, *problem) {
	var wait time.Duration
	found := false
	for _, line := range h.Values("Prefer") {
		for pref := range strings.SplitSeq(line, ",") {
			token, _, _ := strings.Cut(strings.TrimSpace(pref), ";") // parameters: wait takes none
			name, value, hasValue := strings.Cut(token, "=")
			if !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			value = strings.Trim(strings.TrimSpace(value), `"`)
			secs, err := strconv.ParseUint(value, 10, 32)
			if errors.Is(err, strconv.ErrRange) {
				// Whole seconds, too many to count: more than the cap, which cuts any wait
				// over it (as it cuts wait=100000).
				secs, err = math.MaxUint32, nil
			}
			if !hasValue || err != nil {
				return 0, false, badRequest("prefer_wait_invalid", fmt.Sprintf("Prefer: %q: wait takes a whole number of seconds (Prefer: wait=10)", truncate(strings.TrimSpace(pref), 64)))
			}
			if found {
				return 0, false, badRequest("prefer_wait_invalid", "Prefer: wait is given twice; give it once (Prefer: wait=10)")
			}
			wait, found = time.Duration(secs)*time.Second, true
		}
	}
	return wait, found, nil
}

// waiting is a POST's wait for its request's end (Prefer: wait): its slot, and the
// watch of the request's events, started before the request is stored so that it hears
// every one of them: a new request's final status then needs no read of the record.
type waiting struct {
	wait    time.Duration
	watch   *watching
	release func()
}

// startWait takes a waiting status read's slot (MAX_STATUS_WAITS, and the token's share
// of them) and starts watching request id's events, before the request is stored. Nil
// when there is no slot, or the watch cannot start: the POST then does not wait, and
// says nothing of it.
func (a *API) startWait(scope *Scope, clientID, id string, wait time.Duration) *waiting {
	wait = min(wait, a.cfg.MaxStatusWait)
	if wait <= 0 {
		return nil
	}
	release, _, ok := a.takeSlot(scope, a.waits, scope.readShare())
	if !ok {
		return nil
	}
	watch, err := a.watch(clientID, id)
	if err != nil {
		release()
		return nil
	}
	return &waiting{wait: wait, watch: watch, release: func() { watch.stop(); release() }}
}

// answerWhenFinal holds the answer to a POST that asked to wait (Prefer: wait), as a
// status read with ?wait does, until the request it stored is final (delivered,
// dead-lettered, cancelled) or the wait ends, and answers 200 with its status then,
// raven's answer included: true when it answered. False, with Preference-Applied set,
// when the wait ended first: the caller answers 202 as it would have, the request being
// queued as before.
//
// A new request's status is worked out from its accepted event and the events its
// watch heard, without a read: the watch began before the request was stored. One sent
// again with its Idempotency-Key (dup) may have ended before: its record is read.
func (a *API) answerWhenFinal(w http.ResponseWriter, r *http.Request, scope *Scope, wt *waiting, accepted request.Event, dup bool) bool {
	w.Header().Set(PreferenceAppliedHeader, "wait="+strconv.Itoa(int(wt.wait/time.Second)))
	if dup { // its watch, started before the publish, hears what comes after the read
		st, err := a.readStatus(r.Context(), w, accepted.ClientID, accepted.ID, wt.wait, scope, false, wt.watch)
		if err != nil {
			if r.Context().Err() == nil {
				a.log.Debug().Err(err).Str("request_id", accepted.ID).Msg("waiting for a final state to answer a POST failed; answering 202")
			}
			return false
		}
		if !st.Final() {
			return false
		}
		writeJSON(w, http.StatusOK, st)
		return true
	}
	// The server's write timeout is for answers that do not wait: this one may.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wt.wait + 10*time.Second))
	timer := time.NewTimer(wt.wait)
	defer timer.Stop()
	for {
		st := request.StatusOf(accepted.ID, append([]request.Event{accepted}, wt.watch.events()...))
		if st.Final() {
			writeJSON(w, http.StatusOK, st)
			return true
		}
		select {
		case <-wt.watch.changed:
		case <-timer.C:
			return false
		case <-r.Context().Done():
			return false
		}
	}
}
