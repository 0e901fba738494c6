package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/queue"
)

// benchBudget measures raven's budget (ADR 7) on one dispatcher owning every partition:
// the throughput under a binding static budget with many backlogged clients, what a
// budget that does not bind costs, and how adaptive mode finds a raven's capacity.
func benchBudget(ctx context.Context, s settings, log io.Writer) ([]row, error) {
	clients, interval, capacity, adaptFor := 10_000, 5*time.Second, 500.0, 60*time.Second
	if s.quick {
		clients, interval, capacity, adaptFor = 500, time.Second, 100, 12*time.Second
	}
	var rows []row

	// A static budget of half the load, 10,000 backlogged clients.
	settle()
	budget := float64(clients) / interval.Seconds() / 2
	rec, err := budgetRun(ctx, clients, interval, 2*interval+s.dispatchFor, nil, func(c *dispatch.Config) { c.Budget.MaxRate = budget })
	if err != nil {
		return nil, err
	}
	got := rec.rate(rec.start.Add(2*interval), rec.start.Add(2*interval+s.dispatchFor))
	fmt.Fprintf(log, "bench: budget %.0f/s, %d clients at %s: %.1f sends/s\n", budget, clients, interval, got)
	rows = append(rows, row{
		figure:    fmt.Sprintf("budget: sends/s under a static budget, %d backlogged clients, %s interval", clients, interval),
		value:     fmt.Sprintf("%.1f/s", got),
		reference: fmt.Sprintf("%.0f/s budget (half the load)", budget),
		ratio:     fmt.Sprintf("%.3f", got/budget),
		target:    ">= 0.98",
		verdict:   verdict(got/budget >= 0.98),
	})

	// The cost of a budget that does not bind: as many clients as the dispatcher can
	// take at a 10 ms interval (far more than it sends), without a budget and with one far
	// above, in interleaved rounds.
	var without, with []float64
	rounds, roundFor := 5, s.dispatchFor/5
	if s.quick {
		rounds = 1
	}
	for i := range 2 * rounds {
		settle()
		tune := func(*dispatch.Config) {}
		if i%2 == 1 {
			tune = func(c *dispatch.Config) { c.Budget.MaxRate = 1_000_000 }
		}
		rec, err := budgetRun(ctx, 2000, 10*time.Millisecond, time.Second+roundFor, nil, tune)
		if err != nil {
			return rows, err
		}
		r := rec.rate(rec.start.Add(time.Second), rec.start.Add(time.Second+roundFor))
		if i%2 == 0 {
			without = append(without, r)
		} else {
			with = append(with, r)
		}
	}
	mw, mb := median(without), median(with)
	fmt.Fprintf(log, "bench: budget not binding: %.0f sends/s with, %.0f without (rounds %v / %v)\n", mb, mw, with, without)
	rows = append(rows, row{
		figure:    "budget: sends/s with a budget far above the load (2000 clients, 10 ms interval, dispatcher-bound)",
		value:     fmt.Sprintf("%.0f/s", mb),
		reference: fmt.Sprintf("%.0f/s without a budget (median of %d interleaved rounds)", mw, rounds),
		ratio:     fmt.Sprintf("%.3f", mb/mw),
		target:    ">= 0.98",
		verdict:   verdict(mb/mw >= 0.98),
	})

	// Adaptive mode against a raven with a true capacity, four times over it.
	settle()
	load := capacity * 4
	n := int(load * interval.Seconds())
	cr := &capacityRaven{rate: capacity, tokens: capacity / 10}
	rec, err = budgetRun(ctx, n, interval, interval+adaptFor, cr, func(c *dispatch.Config) { c.Adaptive.Enabled = true })
	if err != nil {
		return rows, err
	}
	first := rec.start.Add(interval) // past the start-up fence
	conv, ok := rec.converged(first, first.Add(adaptFor), 0.8*capacity, 1.05*capacity)
	attempts, refused := rec.refused(conv, first.Add(adaptFor))
	share := float64(refused) / float64(max(attempts, 1))
	var perSecond []string
	for t := first; t.Before(first.Add(adaptFor)); t = t.Add(time.Second) {
		a, r := rec.refused(t, t.Add(time.Second))
		perSecond = append(perSecond, fmt.Sprintf("%d-%d", a, r))
	}
	fmt.Fprintf(log, "bench: adaptive against capacity %.0f/s (load %.0f/s): converged after %s (%v), then %d attempts, %.1f%% refused; attempts each second %v\n",
		capacity, load, conv.Sub(first), ok, attempts, 100*share, perSecond)
	convText := "never"
	if ok {
		convText = conv.Sub(first).Round(100 * time.Millisecond).String()
	}
	rows = append(rows, row{
		figure:    fmt.Sprintf("adaptive: time to settle within 0.8-1.05 x raven's capacity, load %.0fx capacity", load/capacity),
		value:     convText,
		reference: fmt.Sprintf("capacity %.0f/s (token bucket, 503 beyond)", capacity),
		ratio:     "-",
		target:    "<= 30s",
		verdict:   verdict(ok && conv.Sub(first) <= 30*time.Second),
	}, row{
		figure:    "adaptive: share of attempts refused after settling",
		value:     fmt.Sprintf("%.1f%%", 100*share),
		reference: fmt.Sprintf("%d attempts over %s", attempts, first.Add(adaptFor).Sub(conv).Round(time.Second)),
		ratio:     "-",
		target:    "< 5%",
		verdict:   verdict(ok && share < 0.05),
	})
	return rows, nil
}

// budgetRun runs a dispatcher tuned by tune for d against clients backlogged clients at
// interval, each delivery queueing one more request for its client; raven is cr when
// given (refusing beyond its capacity), else a raven that takes everything.
func budgetRun(ctx context.Context, clients int, interval, d time.Duration, cr *capacityRaven, tune func(*dispatch.Config)) (*recorder, error) {
	n, err := startNode(ctx, false, queue.Config{})
	if err != nil {
		return nil, err
	}
	defer n.close()
	rec := &recorder{}
	topUps := make(chan string, 1<<20)
	var h http.Handler = fastRaven{arrived: func(client, _ string, at, _ time.Time) {
		rec.add(at, http.StatusOK)
		topUps <- client
	}}
	if cr != nil {
		cr.rec, cr.topUps = rec, topUps
		h = cr
	}
	ravenURL, stopRaven, err := serve(h)
	if err != nil {
		return nil, err
	}
	defer stopRaven()
	stopPublishing := topUp(ctx, n, topUps, io.Discard)
	defer stopPublishing()
	for i := range clients {
		c := fmt.Sprintf("client-%05d", i)
		topUps <- c
		topUps <- c
	}
	for len(topUps) > 0 { // queued before the dispatcher starts
		time.Sleep(10 * time.Millisecond)
	}
	_, stopDispatch, err := startDispatcher(ctx, n, ravenURL, interval, tune)
	if err != nil {
		return nil, err
	}
	rec.start = time.Now()
	time.Sleep(d)
	stopDispatch()
	return rec, nil
}

// capacityRaven takes rate attempts a second (a token bucket with a tenth of a second's
// burst) and answers 503 beyond; a refused client's request stays, so no top-up.
type capacityRaven struct {
	mu           sync.Mutex
	rate, tokens float64
	last         time.Time
	rec          *recorder
	topUps       chan string
}

func (c *capacityRaven) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	_, _ = io.Copy(io.Discard, r.Body)
	c.mu.Lock()
	if !c.last.IsZero() {
		c.tokens = min(c.rate/10, c.tokens+at.Sub(c.last).Seconds()*c.rate)
	}
	c.last = at
	ok := c.tokens >= 1
	if ok {
		c.tokens--
	}
	c.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		c.rec.add(at, http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
	c.rec.add(at, http.StatusOK)
	c.topUps <- r.Header.Get("X-Client-Id")
}

// recorder keeps each attempt's arrival time and status.
type recorder struct {
	mu    sync.Mutex
	start time.Time
	at    []time.Time
	codes []int
}

func (r *recorder) add(at time.Time, code int) {
	r.mu.Lock()
	r.at, r.codes = append(r.at, at), append(r.codes, code)
	r.mu.Unlock()
}

// rate is attempts a second that arrived in [from, to).
func (r *recorder) rate(from, to time.Time) float64 {
	n, _ := r.refused(from, to)
	return float64(n) / to.Sub(from).Seconds()
}

// refused counts the attempts in [from, to) and those refused.
func (r *recorder) refused(from, to time.Time) (attempts, refused int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, at := range r.at {
		if !at.Before(from) && at.Before(to) {
			attempts++
			if r.codes[i] != http.StatusOK {
				refused++
			}
		}
	}
	return attempts, refused
}

// converged is the first second from which every 5-second window up to to has a rate
// between lo and hi.
func (r *recorder) converged(from, to time.Time, lo, hi float64) (time.Time, bool) {
	const w = 5 * time.Second
	for t := from; !t.Add(w).After(to); t = t.Add(time.Second) {
		ok := true
		for u := t; !u.Add(w).After(to); u = u.Add(time.Second) {
			if rt := r.rate(u, u.Add(w)); rt < lo || rt > hi {
				ok = false
				break
			}
		}
		if ok {
			return t, true
		}
	}
	return to, false
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
