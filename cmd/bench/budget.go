package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/raven"
)

// benchBudget measures raven's budget (ADR 7) on one dispatcher owning every partition:
// the throughput under a binding static budget with many backlogged clients, what a
// budget that does not bind costs, and how adaptive mode finds a raven's capacity.
func benchBudget(ctx context.Context, s settings, log io.Writer) ([]row, error) {
	clients, interval, capacity, adaptFor := 10_000, 5*time.Second, 500.0, 60*time.Second
	if s.quick {
		clients, interval, capacity, adaptFor = 500, time.Second, 100, 8*time.Second
	}
	var rows []row

	// A static budget of half the load, 10,000 backlogged clients.
	settle()
	budget := float64(clients) / interval.Seconds() / 2
	rec, err := backlogged{clients: clients, interval: interval, d: 2*interval + s.dispatchFor,
		tune: func(c *dispatch.Config) { c.Budget.MaxRate = budget }}.run(ctx)
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

	// The cost of a budget that does not bind: the dispatcher saturated, without a
	// budget and with one far above, in interleaved rounds.
	rounds, roundFor := 5, s.dispatchFor/5
	if s.quick {
		rounds = 1
	}
	without, with, err := interleaved(rounds, func(on bool) (float64, error) {
		b := backlogged{}
		if on {
			b.tune = func(c *dispatch.Config) { c.Budget.MaxRate = 1_000_000 }
		}
		return b.saturated(ctx, roundFor)
	})
	if err != nil {
		return rows, err
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

	adaptive, err := benchAdaptive(ctx, log, capacity, interval, adaptFor)
	return append(rows, adaptive...), err
}

// benchAdaptive runs adaptive mode against a raven with a true capacity, four times over
// it: how soon it settles near the capacity, and how much raven refuses after.
func benchAdaptive(ctx context.Context, log io.Writer, capacity float64, interval, adaptFor time.Duration) ([]row, error) {
	settle()
	load := capacity * 4
	n := int(load * interval.Seconds())
	cr := &capacityRaven{rate: capacity, tokens: capacity / 10}
	rec, err := backlogged{clients: n, interval: interval, d: interval + adaptFor, raven: cr,
		tune: func(c *dispatch.Config) { c.Adaptive.Enabled = true }}.run(ctx)
	if err != nil {
		return nil, err
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
	return []row{{
		figure:    fmt.Sprintf("adaptive: time to settle within 0.8-1.05 x raven's capacity, load %.0fx capacity", load/capacity),
		value:     convText,
		reference: fmt.Sprintf("capacity %.0f/s (token bucket, 503 beyond)", capacity),
		ratio:     "-",
		target:    "<= 30s",
		verdict:   verdict(ok && conv.Sub(first) <= 30*time.Second),
	}, {
		figure:    "adaptive: share of attempts refused after settling",
		value:     fmt.Sprintf("%.1f%%", 100*share),
		reference: fmt.Sprintf("%d attempts over %s", attempts, first.Add(adaptFor).Sub(conv).Round(time.Second)),
		ratio:     "-",
		target:    "< 5%",
		verdict:   verdict(ok && share < 0.05),
	}}, nil
}

// backlogged is a run of clients that always have a backlog, through one dispatcher
// owning every partition: each delivery queues one more request for its client.
type backlogged struct {
	clients    int
	interval   time.Duration
	d          time.Duration          // how long the dispatcher runs
	syncAlways bool                   // fsync every write; else every 2 min
	events     bool                   // write requests' events, as the binaries do by default
	raven      *capacityRaven         // refusing beyond its capacity; nil: a raven that takes everything
	tune       func(*dispatch.Config) // if not nil, changes the dispatcher's configuration
	log        io.Writer              // if not nil, hears what the event writer did
	answer     int                    // raven answers each request with a JSON body of this many bytes
	keepNone   bool                   // RESPONSE_MAX_BYTES=0: no answer body kept (the default keeps 64 KiB)
}

// run queues two requests for each client, then runs the dispatcher for b.d and records
// each attempt raven receives.
func (b backlogged) run(ctx context.Context) (*recorder, error) {
	n, err := startNode(ctx, b.syncAlways, queue.Config{})
	if err != nil {
		return nil, err
	}
	defer n.close()
	var ev *events
	if b.events {
		ev = startEvents(n)
		defer ev.close() // once the dispatcher has stopped
	}
	rec := &recorder{}
	topUps := make(chan string, 1<<20)
	var h http.Handler = fastRaven{answer: jsonAnswer(b.answer), arrived: func(client, _ string, at, _ time.Time) {
		rec.add(at, http.StatusOK)
		topUps <- client
	}}
	if b.raven != nil {
		b.raven.rec, b.raven.topUps = rec, topUps
		h = b.raven
	}
	ravenURL, stopRaven, err := serve(h)
	if err != nil {
		return nil, err
	}
	defer stopRaven()
	stopPublishing := topUp(ctx, n, topUps, ev.accepted, io.Discard)
	defer stopPublishing()
	for i := range b.clients {
		c := fmt.Sprintf("client-%05d", i)
		topUps <- c
		topUps <- c
	}
	for len(topUps) > 0 { // queued before the dispatcher starts
		time.Sleep(10 * time.Millisecond)
	}
	if ev != nil { // and their accepted events written, so as not to slow its start
		_ = ev.w.Flush(ctx)
	}
	keep := raven.DefaultKeepBytes
	if b.keepNone {
		keep = 0
	}
	_, stopDispatch, err := startDispatcherKeeping(ctx, n, ravenURL, keep, b.interval, b.tune, ev.on)
	if err != nil {
		return nil, err
	}
	rec.start = time.Now()
	time.Sleep(b.d)
	stopDispatch()
	if b.log != nil && ev != nil {
		fmt.Fprintf(b.log, "bench: %s\n", ev.close())
	}
	return rec, nil
}

// saturated gives the dispatcher far more than it can send (2000 clients backlogged at
// a 10 ms interval) and returns the sends per second raven receives over d, after a
// second's start.
func (b backlogged) saturated(ctx context.Context, d time.Duration) (float64, error) {
	b.clients, b.interval, b.d = 2000, 10*time.Millisecond, time.Second+d
	rec, err := b.run(ctx)
	if err != nil {
		return 0, err
	}
	return rec.rate(rec.start.Add(time.Second), rec.start.Add(time.Second+d)), nil
}

// interleaved measures with run, settling before each round, rounds times off and on
// in turn (off first), and returns each side's figures.
func interleaved(rounds int, run func(on bool) (float64, error)) (off, on []float64, err error) {
	for i := range 2 * rounds {
		settle()
		r, err := run(i%2 == 1)
		if err != nil {
			return off, on, err
		}
		if i%2 == 0 {
			off = append(off, r)
		} else {
			on = append(on, r)
		}
	}
	return off, on, nil
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

// jsonAnswer is a JSON object of n bytes, as raven might answer (nil for 0).
func jsonAnswer(n int) []byte {
	if n == 0 {
		return nil
	}
	const head, tail = `{"result":"`, `"}`
	return []byte(head + strings.Repeat("x", max(0, n-len(head)-len(tail))) + tail)
}
