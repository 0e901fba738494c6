package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// statusReadRate is how many statuses a second readStatuses reads.
const statusReadRate = 30

// recentIDs keeps the ids of the last requests published, each with its clientId as a
// status read names it ("<id>?clientId=<clientId>"), to read the status of one.
type recentIDs struct {
	mu   sync.Mutex
	ids  [4096]string
	n    int // ids added in all
	next int
}

// add keeps id, in place of the oldest kept when full.
func (r *recentIDs) add(id string) {
	r.mu.Lock()
	r.ids[r.next] = id
	r.next = (r.next + 1) % len(r.ids)
	r.n++
	r.mu.Unlock()
}

// pick is one of the kept ids at random; false when none was added yet.
func (r *recentIDs) pick() (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == 0 {
		return "", false
	}
	return r.ids[rand.IntN(min(r.n, len(r.ids)))], true
}

// statusReads are the status reads of readStatuses: each one's latency, and the answers
// by state (or by HTTP status, when not 200).
type statusReads struct {
	lat    samples
	mu     sync.Mutex
	states map[string]int
}

// readStatuses reads, rate times a second, the status of one of recent through the
// ingest API at url (GET /v1/requests/{id}?clientId=), one read at a time, until stop is called
// (which waits for the reader).
func readStatuses(url string, recent *recentIDs, rate float64) (reads *statusReads, stop func()) {
	reads = &statusReads{states: map[string]int{}}
	client := httpClient(1)
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			if id, ok := recent.pick(); ok {
				reads.read(client, url+"/v1/requests/"+id)
			}
		}
	}()
	return reads, func() { close(done); <-stopped; client.CloseIdleConnections() }
}

// read reads one status and records its latency and answer.
func (r *statusReads) read(client *http.Client, url string) {
	start := time.Now()
	resp, err := client.Get(url)
	state := "error"
	if err == nil {
		var st struct{ Status string }
		switch {
		case resp.StatusCode != http.StatusOK:
			state = fmt.Sprintf("HTTP %d", resp.StatusCode)
		case json.NewDecoder(resp.Body).Decode(&st) != nil:
			state = "unreadable"
		default:
			state = st.Status
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		r.lat.add(time.Since(start))
	}
	r.mu.Lock()
	r.states[state]++
	r.mu.Unlock()
}

// summary says how many reads answered what: "300 reads: 290 queued, 10 unknown".
func (r *statusReads) summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var parts []string
	total := 0
	for _, state := range slices.Sorted(maps.Keys(r.states)) {
		parts = append(parts, fmt.Sprintf("%d %s", r.states[state], state))
		total += r.states[state]
	}
	return fmt.Sprintf("%d reads: %s", total, strings.Join(parts, ", "))
}
