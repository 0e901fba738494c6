package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// benchDispatch runs N clients that always have a backlog at the interval, and compares
// the sends per second raven receives with the ideal N/interval; it also reports the
// spacing overshoot (gap between two arrivals of a client, minus the interval).
//
// The clients start spread over one interval, as clients arriving at random would, and
// each delivery queues one more request for its client, so that every client keeps a
// backlog for the whole run.
//
// Each delivery is a delete, and each top-up a publish: at N/interval sends per second the
// request stream takes twice that many writes. Events are on, as in the binaries: each
// send also writes three events (accepted and attempt started in the background, delivered
// before the delete). With fsync on every write the disk's sync rate bounds what the
// dispatcher can do, so the largest N runs in both durability modes.
//
// Meanwhile statuses of requests just published are read through the ingest API.
func benchDispatch(ctx context.Context, s settings, log io.Writer) ([]row, error) {
	var rows []row
	for i, n := range s.dispatchN {
		modes := []bool{true}
		if i == len(s.dispatchN)-1 {
			modes = []bool{true, false}
		}
		for _, syncAlways := range modes {
			settle()
			r, _, err := dispatchOnce(ctx, s, n, syncAlways, log, nil)
			rows = append(rows, r...)
			if err != nil {
				return rows, err
			}
		}
	}
	return rows, nil
}

// dispatchOnce runs benchDispatch's load for clients, with events on (the product's
// default) and statuses read through the ingest API during the window.
//
// tp, if not nil, traces ingest and the dispatcher (the tracing scenario). It returns the
// rows and the sends per second in the window.
func dispatchOnce(ctx context.Context, s settings, clients int, syncAlways bool, log io.Writer, tp trace.TracerProvider) ([]row, float64, error) {
	interval := s.interval
	mode := modeName(syncAlways)
	n, err := startNode(ctx, syncAlways, queue.Config{})
	if err != nil {
		return nil, 0, err
	}
	defer n.close()
	ev := startEvents(n)
	defer ev.close() // once the dispatcher has stopped
	ingestURL, stopIngest, err := serveIngest(n, ingest.Config{Live: n.q, Status: n.q, Tracing: tp})
	if err != nil {
		return nil, 0, err
	}
	defer stopIngest()
	sp := &spacing{interval: interval, topUps: make(chan string, 1<<20), last: make(map[string][2]time.Time, clients)}
	ravenURL, stopRaven, err := serve(fastRaven{arrived: sp.arrived})
	if err != nil {
		return nil, 0, err
	}
	defer stopRaven()
	d, stopDispatch, err := startDispatcher(ctx, n, ravenURL, interval, ev.on, func(c *dispatch.Config) { c.Tracing = tp })
	if err != nil {
		return nil, 0, err
	}
	defer stopDispatch()
	recent := &recentIDs{}
	stopPublishing := topUp(ctx, n, sp.topUps, func(r request.Request, rc request.Receipt) {
		ev.accepted(r, rc)
		recent.add(r.ID + "?clientId=" + url.QueryEscape(r.ClientID))
	}, log)
	defer stopPublishing()

	lanes, reads := sp.measure(s, clients, func() int { return d.Stats().Lanes }, func() (*statusReads, func()) {
		return readStatuses(ingestURL, recent, statusReadRate)
	})
	stopPublishing()
	stopDispatch()

	rate := float64(sp.inWindow.Load()) / s.dispatchFor.Seconds()
	record, err := eventSubjects(ctx, n, clients, mode)
	if err != nil {
		return nil, 0, err
	}
	return sp.report(log, clients, interval, mode, lanes, rate, record, reads, ev.close), rate, nil
}

// report logs and gives the dispatch run's rows: its rate against the ideal, the
// spacing overshoot, the gaps from raven's previous answer, the record's subjects and the
// status reads. closeEvents stops the event writer and says what it wrote.
func (sp *spacing) report(log io.Writer, clients int, interval time.Duration, mode string, lanes int, rate float64, record row, reads *statusReads, closeEvents func() string) []row {
	ideal := float64(clients) / interval.Seconds()
	q := sp.over.quantiles(0.5, 0.99, 1, 0)
	qe := sp.overEnd.quantiles(0.5, 0.99, 1, 0)
	qs := reads.lat.quantiles(0.5, 0.99)
	fmt.Fprintf(log, "bench: dispatch %d clients (%s): %.0f sends/s of %.0f ideal, lanes %d, overshoot p50 %s p99 %s max %s min %s; from the previous answer p50 %s p99 %s min %s; status reads p50 %s p99 %s (%s); %s\n",
		clients, mode, rate, ideal, lanes, q[0], q[1], q[2], q[3], qe[0], qe[1], qe[3], qs[0], qs[1], reads.summary(), closeEvents())
	return []row{
		{
			figure:    fmt.Sprintf("dispatch sends/s, %d backlogged clients, %s interval (events on; %s)", clients, interval, mode),
			value:     fmt.Sprintf("%.0f/s", rate),
			reference: fmt.Sprintf("%.0f/s ideal (N/interval)", ideal),
			ratio:     fmt.Sprintf("%.3f", rate/ideal),
			target:    ">= 0.98",
			verdict:   verdict(rate/ideal >= 0.98),
		},
		{
			figure:    fmt.Sprintf("spacing overshoot p50 / p99 / max, %d clients (arrival gap - interval, at raven; %s)", clients, mode),
			value:     ms(q[0]) + " / " + ms(q[1]) + " / " + ms(q[2]),
			reference: fmt.Sprintf("%d gaps; least %s", sp.over.len(), ms(q[3])),
			ratio:     "-",
			target:    "p99 < 20 ms",
			verdict:   verdict(q[1] < 20*time.Millisecond && sp.over.len() > 0),
		},
		{
			figure:    fmt.Sprintf("  the same from raven's previous answer, p50 / p99 / least, %d clients (%s)", clients, mode),
			value:     ms(qe[0]) + " / " + ms(qe[1]) + " / " + ms(qe[3]),
			reference: fmt.Sprintf("%d below zero", sp.negative.Load()),
			ratio:     "-",
			target:    "none < 0",
			verdict:   verdict(sp.negative.Load() == 0 && sp.overEnd.len() > 0),
		},
		record,
		{
			figure:    fmt.Sprintf("status read latency p50 / p99 during the %d-client dispatch (events on; %s)", clients, mode),
			value:     ms(qs[0]) + " / " + ms(qs[1]),
			reference: fmt.Sprintf("GET /v1/requests/{id}, %d/s, of the last 4096 ids published: %s", statusReadRate, reads.summary()),
			ratio:     "-", target: "-", verdict: "-",
		},
	}
}

// measure starts the clients, spread over an interval, each with two requests (each
// delivery asks for another), and measures over s.dispatchFor from two intervals on,
// reading statuses meanwhile. It returns the dispatcher's lanes at mid-window (from
// lanes) and the status reads.
func (sp *spacing) measure(s settings, clients int, lanes func() int, read func() (*statusReads, func())) (int, *statusReads) {
	interval := s.interval
	time.Sleep(interval + 100*time.Millisecond) // past the dispatcher's start-up fence
	start := time.Now()
	for i := range clients {
		time.Sleep(time.Until(start.Add(time.Duration(i) * interval / time.Duration(clients))))
		c := fmt.Sprintf("client-%05d", i)
		sp.topUps <- c
		sp.topUps <- c
	}
	ws := start.Add(2 * interval)
	we := ws.Add(s.dispatchFor)
	sp.windowStart.Store(ws.UnixNano())
	sp.windowEnd.Store(we.UnixNano())
	time.Sleep(time.Until(ws))
	reads, stopReads := read()
	time.Sleep(time.Until(ws.Add(s.dispatchFor / 2)))
	n := lanes()
	time.Sleep(time.Until(we))
	stopReads()
	time.Sleep(100 * time.Millisecond)
	return n, reads
}

// spacing measures, at raven, each client's gaps within a window, and asks for a new
// request of a client each time one of its requests arrives (topUps).
type spacing struct {
	interval    time.Duration
	topUps      chan string
	mu          sync.Mutex
	last        map[string][2]time.Time // arrived, answered
	over        samples                 // gap from the previous arrival, minus the interval
	overEnd     samples                 // gap from the previous answer, minus the interval
	windowStart atomic.Int64
	windowEnd   atomic.Int64
	inWindow    atomic.Int64
	negative    atomic.Int64
}

func (sp *spacing) arrived(client, _ string, at, answered time.Time) {
	sp.topUps <- client
	sp.mu.Lock()
	prev, seen := sp.last[client]
	sp.last[client] = [2]time.Time{at, answered}
	sp.mu.Unlock()
	if ws := sp.windowStart.Load(); ws == 0 || at.UnixNano() < ws || at.UnixNano() > sp.windowEnd.Load() {
		return
	}
	sp.inWindow.Add(1)
	if seen {
		o := at.Sub(prev[0]) - sp.interval
		oe := at.Sub(prev[1]) - sp.interval
		if oe < 0 {
			sp.negative.Add(1)
		}
		sp.over.add(o)
		sp.overEnd.add(oe)
	}
}

// topUp publishes a request for each client named on topUps, 32 at a time, until stop is
// called (which waits for the publishers). Each has an id as ingest gives out, so that
// its events are written; stored hears of each one the queue stored.
func topUp(ctx context.Context, n *node, topUps <-chan string, stored func(request.Request, request.Receipt), log io.Writer) (stop func()) {
	pctx, cancel := context.WithCancel(ctx)
	publish := func(client string) {
		r := request.Request{ID: request.NewID(time.Now()), ClientID: client, ContentType: "application/json", Body: body(client)}
		rc, err := n.q.Publish(pctx, r)
		switch {
		case err == nil:
			stored(r, rc)
		case pctx.Err() == nil:
			fmt.Fprintf(log, "bench: publish: %v\n", err)
		}
	}
	var pubs sync.WaitGroup
	for range 32 {
		pubs.Go(func() {
			for {
				select {
				case <-pctx.Done():
					return
				case c := <-topUps:
					publish(c)
				}
			}
		})
	}
	return func() { cancel(); pubs.Wait() }
}

// eventSubjects is the row of what the status record holds after a run over clients:
// its subjects (ADR 10: a subject per client and event type, none per request) against
// the requests it has events of.
func eventSubjects(ctx context.Context, n *node, clients int, mode string) (row, error) {
	js, err := jetstream.New(n.nc)
	if err != nil {
		return row{}, err
	}
	st, err := js.Stream(ctx, queue.EventStream)
	if err != nil {
		return row{}, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return row{}, err
	}
	most := uint64(clients * len(request.EventTypes))
	return row{
		figure:    fmt.Sprintf("subjects in the events stream after the %d-client dispatch (the service's writer; %s)", clients, mode),
		value:     thousands(int(info.State.NumSubjects)),
		reference: fmt.Sprintf("%s clients, %s events stored", thousands(clients), thousands(int(info.State.Msgs))),
		ratio:     fmt.Sprintf("%.2f", float64(info.State.NumSubjects)/float64(clients)),
		target:    fmt.Sprintf("<= %d per client, whatever the requests", len(request.EventTypes)),
		verdict:   verdict(info.State.NumSubjects <= most && info.State.Msgs > info.State.NumSubjects),
	}, nil
}
