// Package ledger is a stand-in for raven that records every arrival and checks the
// record against the dispatcher's guarantees: every accepted request arrived or was
// dead-lettered, each client's requests arrived in order, no two attempts of a client were
// closer than the interval, and how many arrivals were duplicates.
//
// The standalone demo uses it as its receiver (logging each arrival and its gap); the
// integration tests use it as their recording raven.
package ledger

import (
	"io"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"
)

// Arrival is one request raven received.
type Arrival struct {
	ClientID string
	ID       string
	Attempt  int
	Start    time.Time // when the request arrived
	End      time.Time // when the answer was written
	Status   int
	Aborted  bool // the sender gave up before the answer was written
	// Header and Body are what arrived; not kept with Options.Forget.
	Header http.Header
	Body   []byte
}

// Response is what the ledger answers one arrival with.
type Response struct {
	Status     int           // defaults to 200
	RetryAfter string        // Retry-After header, if any
	Delay      time.Duration // how long to take before answering
}

// Options configure a Ledger.
type Options struct {
	// Respond picks the answer to an arrival; nil answers 200 at once.
	Respond func(a Arrival) Response
	// OnArrival is called after each answer with the gap since the previous arrival of the
	// same client (zero for a client's first).
	OnArrival func(a Arrival, gap time.Duration)
	// Forget keeps no arrivals, only each client's last arrival time: for long demo runs.
	Forget bool
}

// Ledger is an http.Handler that records arrivals.
type Ledger struct {
	opts     Options
	mu       sync.Mutex
	arrivals []Arrival
	last     map[string]time.Time
}

// New returns an empty Ledger.
func New(opts Options) *Ledger {
	return &Ledger{opts: opts, last: make(map[string]time.Time)}
}

// ServeHTTP records one arrival and answers it.
func (l *Ledger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a := Arrival{
		ClientID: r.Header.Get("X-Client-Id"),
		ID:       r.Header.Get("Idempotency-Key"),
		Start:    time.Now(),
	}
	a.Attempt, _ = strconv.Atoi(r.Header.Get("X-Dispatch-Attempt"))
	// Reading the body to its end lets the server notice when the sender hangs up.
	if l.opts.Forget {
		_, _ = io.Copy(io.Discard, r.Body)
	} else {
		a.Header = r.Header.Clone()
		a.Body, _ = io.ReadAll(r.Body)
	}
	resp := Response{Status: http.StatusOK}
	if l.opts.Respond != nil {
		resp = l.opts.Respond(a)
		if resp.Status == 0 {
			resp.Status = http.StatusOK
		}
	}
	if resp.Delay > 0 {
		select {
		case <-time.After(resp.Delay):
		case <-r.Context().Done():
			a.Aborted = true
		}
	}
	if resp.RetryAfter != "" {
		w.Header().Set("Retry-After", resp.RetryAfter)
	}
	a.Status = resp.Status
	a.End = time.Now()
	w.WriteHeader(resp.Status)

	l.mu.Lock()
	prev, seen := l.last[a.ClientID]
	l.last[a.ClientID] = a.Start
	if !l.opts.Forget {
		l.arrivals = append(l.arrivals, a)
	}
	l.mu.Unlock()
	if l.opts.OnArrival != nil {
		var gap time.Duration
		if seen {
			gap = a.Start.Sub(prev)
		}
		l.opts.OnArrival(a, gap)
	}
}

// Arrivals returns a copy of every arrival so far, in the order they arrived.
func (l *Ledger) Arrivals() []Arrival {
	l.mu.Lock()
	out := append([]Arrival(nil), l.arrivals...)
	l.mu.Unlock()
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}

// Delivered counts the distinct ids answered 2xx so far.
func (l *Ledger) Delivered() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := map[string]bool{}
	for _, a := range l.arrivals {
		if ok(a) {
			ids[a.ID] = true
		}
	}
	return len(ids)
}

func ok(a Arrival) bool { return a.Status >= 200 && a.Status < 300 && !a.Aborted }
