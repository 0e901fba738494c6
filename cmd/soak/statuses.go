package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/penguinhq/dispatcher/pkg/ledger"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// readStatuses is penguin asking what became of its requests while the load runs:
// about five times a second, the status of a random accepted request through a random
// ingest (GET /v1/requests/{id}?clientId=). Every answer must be a 200 with a state
// other than unknown (each was accepted), or a 503 with Retry-After while a fault keeps
// the store or the dispatchers from answering; anything else is unexpected.
func (l *load) readStatuses(rng *rand.Rand) {
	hc := &http.Client{Timeout: 10 * time.Second}
	for {
		select {
		case <-l.stop:
			return
		case <-time.After(time.Duration(100+rng.IntN(200)) * time.Millisecond):
		}
		l.mu.Lock()
		var a ledger.Accepted
		if n := len(l.accepted); n > 0 {
			a = l.accepted[rng.IntN(n)]
		}
		l.mu.Unlock()
		if a.ID == "" {
			continue
		}
		code, state, err := readStatus(hc, l.ingests[rng.IntN(len(l.ingests))], a, 0)
		l.mu.Lock()
		switch {
		case err != nil:
			l.reads["no answer"]++ // a fault on the way to ingest: penguin asks again
		case code == http.StatusOK:
			l.reads["200 "+state]++
			if state == string(request.StateUnknown) && len(l.unexpected) < 20 {
				// Accepted before it was picked: unknown would be a guess (issue 60).
				l.unexpected = append(l.unexpected, fmt.Sprintf("status read of %s (%s), accepted: 200 unknown", a.ID, a.ClientID))
			}
		case code == http.StatusServiceUnavailable:
			l.reads["503"]++
		default:
			l.reads[strconv.Itoa(code)]++
			if len(l.unexpected) < 20 {
				l.unexpected = append(l.unexpected, fmt.Sprintf("status read of %s (%s): %d", a.ID, a.ClientID, code))
			}
		}
		l.mu.Unlock()
	}
}

// readStatus reads one request's status through the ingest at base, waiting up to wait
// for a final state: the HTTP status and the request's state.
func readStatus(hc *http.Client, base string, a ledger.Accepted, wait time.Duration) (int, string, error) {
	u := base + "/v1/requests/" + url.PathEscape(a.ID) + "?clientId=" + url.QueryEscape(a.ClientID)
	if wait > 0 {
		u += "&wait=" + wait.String()
	}
	resp, err := hc.Get(u)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var st struct{ Status string }
	_ = json.Unmarshal(raw, &st)
	return resp.StatusCode, st.Status, nil
}

// finalStatuses checks G10 once the backlog drained: the status of every accepted
// request in a sample of up to 200 (every k-th) says what the ledger saw, delivered or
// dead-lettered, within a 10 s wait. It returns how many it read, and the broken ones.
func finalStatuses(bases []string, accepted []ledger.Accepted, delivered, dead map[string]bool) (read int, broken []string) {
	hc := &http.Client{Timeout: 30 * time.Second}
	step := max(len(accepted)/200, 1)
	for i := 0; i < len(accepted); i += step {
		a := accepted[i]
		want := "delivered"
		switch {
		case delivered[a.ID]:
		case dead[a.ID]:
			want = "dead_lettered"
		default:
			continue // lost: the ledger reports it
		}
		read++
		code, state, err := readStatus(hc, bases[i%len(bases)], a, 10*time.Second)
		if err != nil || code != http.StatusOK || state != want {
			broken = append(broken, fmt.Sprintf("G10: the status of %s (client %s) reads %d %q (%v) after the drain, want %s", a.ID, a.ClientID, code, state, err, want))
		}
	}
	return read, broken
}
