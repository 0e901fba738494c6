// Package ledger is a stand-in for raven that records every arrival and checks the
// record against the dispatcher's guarantees: every accepted request arrived or was
// dead-lettered, each client's requests arrived in order, no two attempts of a client were
// closer than the interval, and how many arrivals were duplicates.
//
// The standalone demo uses it as its receiver (logging each arrival and its gap); the
// integration tests use it as their recording raven.
package ledger

import (
	"context"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Arrival is one request raven received.
type Arrival struct {
	ClientID string
	ID       string
	Attempt  int
	Start    time.Time // when the request arrived
	// End is when the exchange ended on raven's side: the answer written, the connection
	// dropped or reset, or the sender seen hanging up.
	End     time.Time
	Status  int
	Aborted bool // the sender hung up before raven had finished its answer
	// StatusSent says the status line reached the sender: the sender knows the outcome.
	StatusSent bool
	// Fault is how raven misbehaved on this arrival, if it did.
	Fault Fault `json:",omitempty"`
	// OnConn numbers the request on its connection: 1 for the first request of a fresh
	// connection, more on a reused keep-alive one. Zero when the server was not set up
	// with ConnContext.
	OnConn int `json:",omitempty"`
	// Header and Body are what arrived; not kept with Options.Forget.
	Header http.Header `json:",omitempty"`
	Body   []byte      `json:",omitempty"`
}

// Response is what the ledger answers one arrival with.
type Response struct {
	Status     int           // defaults to 200
	RetryAfter string        // Retry-After header, if any
	Location   string        // Location header, if any (for a 3xx)
	Delay      time.Duration // how long to take before answering
	// Body is written after the status (with ContentType, if set), unless Fault says
	// otherwise.
	Body        []byte
	ContentType string
	// Fault, if not zero, misbehaves instead of (or while) answering.
	Fault Fault
}

// Fault is a way raven (or a proxy in front of it) misbehaves on one request.
type Fault int

// The faults a Response can ask for.
const (
	// Drop reads the whole request, then closes the connection without an answer.
	Drop Fault = iota + 1
	// Reset reads only the request's headers, then resets the connection (TCP RST).
	Reset
	// StallBody sends the status and headers, then no body until the sender hangs up.
	StallBody
	// HugeBody answers with a body of HugeBodyBytes.
	HugeBody
)

// HugeBodyBytes is the size of a HugeBody answer.
const HugeBodyBytes = 256 << 20

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
	opts          Options
	mu            sync.Mutex
	arrivals      []Arrival
	last          map[string]time.Time
	lastDelivered time.Time
}

// New returns an empty Ledger.
func New(opts Options) *Ledger {
	return &Ledger{opts: opts, last: make(map[string]time.Time)}
}

type connKey struct{}

// ConnContext numbers the requests of each connection (Arrival.OnConn): set it as the
// http.Server's ConnContext.
func (l *Ledger) ConnContext(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, new(atomic.Int32))
}

// ServeHTTP records one arrival and answers it.
func (l *Ledger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a := Arrival{
		ClientID: r.Header.Get("X-Client-Id"),
		ID:       r.Header.Get("Idempotency-Key"),
		Start:    time.Now(),
	}
	a.Attempt, _ = strconv.Atoi(r.Header.Get("X-Dispatch-Attempt"))
	if n, ok := r.Context().Value(connKey{}).(*atomic.Int32); ok {
		a.OnConn = int(n.Add(1))
	}
	resp := Response{Status: http.StatusOK}
	if l.opts.Respond != nil {
		resp = l.opts.Respond(a)
		if resp.Status == 0 {
			resp.Status = http.StatusOK
		}
	}
	a.Status, a.Fault = resp.Status, resp.Fault
	if resp.Fault == Reset {
		a.End = time.Now() // raven ends the exchange here: the sender may see the reset before reset returns
		reset(w)
	} else {
		// Reading the body to its end lets the server notice when the sender hangs up.
		if l.opts.Forget {
			_, _ = io.Copy(io.Discard, r.Body)
		} else {
			a.Header = r.Header.Clone()
			a.Body, _ = io.ReadAll(r.Body)
		}
		l.answer(w, r, resp, &a)
	}
	if a.End.IsZero() {
		a.End = time.Now()
	}

	l.mu.Lock()
	prev, seen := l.last[a.ClientID]
	l.last[a.ClientID] = a.Start
	if ok(a) && a.Start.After(l.lastDelivered) {
		l.lastDelivered = a.Start
	}
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

// answer waits resp.Delay, then answers as resp says, noting on a what happened.
func (l *Ledger) answer(w http.ResponseWriter, r *http.Request, resp Response, a *Arrival) {
	if resp.Delay > 0 {
		select {
		case <-time.After(resp.Delay):
		case <-r.Context().Done():
			a.Aborted, a.End = true, time.Now()
			return
		}
	}
	if resp.Fault == Drop {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			a.End = time.Now() // before the close: the sender may see it before Close returns
			_ = conn.Close()
		}
		return
	}
	if resp.RetryAfter != "" {
		w.Header().Set("Retry-After", resp.RetryAfter)
	}
	if resp.Location != "" {
		w.Header().Set("Location", resp.Location)
	}
	if resp.ContentType != "" {
		w.Header().Set("Content-Type", resp.ContentType)
	}
	if resp.Fault == HugeBody {
		w.Header().Set("Content-Length", strconv.Itoa(HugeBodyBytes))
	}
	a.End = time.Now()
	w.WriteHeader(resp.Status)
	if err := http.NewResponseController(w).Flush(); err == nil {
		a.StatusSent = true
	}
	switch resp.Fault {
	case 0:
		if len(resp.Body) > 0 {
			_, _ = w.Write(resp.Body)
		}
	case StallBody:
		<-r.Context().Done()
		a.Aborted, a.End = true, time.Now()
	case HugeBody:
		chunk := make([]byte, 64<<10)
		for sent := 0; sent < HugeBodyBytes; sent += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				a.Aborted = true
				break
			}
		}
		a.End = time.Now()
	}
}

// reset closes the request's connection with a TCP reset, without reading its body.
func reset(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // close sends RST, not FIN
	}
	_ = conn.Close()
}

// Arrivals returns a copy of every arrival so far, in the order they arrived.
func (l *Ledger) Arrivals() []Arrival {
	l.mu.Lock()
	out := append([]Arrival(nil), l.arrivals...)
	l.mu.Unlock()
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}

// LastDelivered is when the latest attempt that raven accepted (and the sender heard so)
// arrived; zero before the first.
func (l *Ledger) LastDelivered() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastDelivered
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

// ok says raven accepted the request and the sender heard so.
func ok(a Arrival) bool { return a.Status >= 200 && a.Status < 300 && a.StatusSent }
