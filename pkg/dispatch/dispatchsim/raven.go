package dispatchsim

import (
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Attempt is one HTTP attempt raven received, as raven saw it.
type Attempt struct {
	Client, ID string
	Instance   string // the process that sent it
	Start      time.Time
	// End is when the exchange ended: raven's answer, or the sender hanging up first.
	End    time.Time
	Status int
	// Accepted: raven took it (2xx), at AcceptedAt; Answered: the sender got that answer
	// (it had not hung up before it).
	Accepted   bool
	AcceptedAt time.Time
	Answered   bool
}

// Raven is the simulated downstream service: it records every attempt and answers as the
// faults drawn for it say (at once, slowly, after the sender gave up, or refusing).
type Raven struct {
	mu       sync.Mutex
	attempts []*Attempt
}

// Attempts is every attempt raven received, in the order they started.
func (r *Raven) Attempts() []Attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Attempt, len(r.attempts))
	for i, a := range r.attempts {
		out[i] = *a
	}
	return out
}

// ravenPort carries one instance's attempts to raven: the http.RoundTripper the real
// raven client sends through.
type ravenPort struct{ in *Instance }

func (p *ravenPort) RoundTrip(req *http.Request) (*http.Response, error) {
	in, w := p.in, p.in.w
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		_ = req.Body.Close()
	}
	ctx := req.Context()
	// A paused process sends nothing until it runs again.
	if err := in.awake(ctx); err != nil {
		return nil, err
	}
	a := &Attempt{Client: req.Header.Get(request.HeaderClientID), ID: req.Header.Get(request.HeaderIdempotencyKey),
		Instance: in.name, Start: time.Now()}
	f := w.draw(in, portRaven, "send", 0)
	a.Status = f.status
	w.raven.mu.Lock()
	w.raven.attempts = append(w.raven.attempts, a)
	w.raven.mu.Unlock()

	answer := a.Start.Add(f.latency)
	t := time.NewTimer(f.latency)
	defer t.Stop()
	hangUp := func(err error) (*http.Response, error) {
		w.raven.mu.Lock()
		a.End = time.Now()
		if a.Accepted = f.status/100 == 2; a.Accepted {
			a.AcceptedAt = answer // raven goes on and takes it: an answer nobody reads
		}
		w.raven.mu.Unlock()
		return nil, err
	}
	select {
	case <-t.C:
	case <-ctx.Done():
		return hangUp(ctx.Err())
	case <-in.dead:
		return hangUp(errKilled)
	}
	w.raven.mu.Lock()
	a.End = time.Now()
	if a.Accepted = f.status/100 == 2; a.Accepted {
		a.AcceptedAt = a.End
	}
	w.raven.mu.Unlock()
	// The answer reaches a paused process when it runs again, if it still waits for it.
	if err := in.awake(ctx); err != nil {
		return nil, err
	}
	w.raven.mu.Lock()
	a.Answered = true
	w.raven.mu.Unlock()
	h := http.Header{}
	if f.retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int(f.retryAfter/time.Second)))
	}
	return &http.Response{StatusCode: f.status, Header: h, Body: http.NoBody, Request: req, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}, nil
}
