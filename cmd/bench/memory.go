package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// benchLaneMemory measures what one backlogged client costs the dispatcher: its lane in
// the scheduler (state, heap entry, map entry, its lane's key). Request bodies are in JetStream,
// not in the dispatcher, so nothing else grows with the number of clients.
func benchLaneMemory(s settings) ([]row, error) {
	lanes := make([]request.Lane, s.laneMemClients)
	for i := range lanes {
		lanes[i] = request.LaneOfClient(i%64, fmt.Sprintf("client-%06d", i))
	}
	before := heapAfterGC()
	sched := schedule.New(schedule.Policy{Interval: 5 * time.Second}.WithDefaults(), func() float64 { return 0 })
	now := time.Now()
	for i, lane := range lanes {
		lane.Token = string([]byte(lane.Token)) // a fresh copy, as a notification brings
		sched.Notify(lane, now.Add(time.Duration(i)), time.Time{})
	}
	after := heapAfterGC()
	runtime.KeepAlive(sched)
	per := float64(after-before) / float64(s.laneMemClients)
	return []row{{
		figure:    fmt.Sprintf("dispatcher heap per backlogged client (%d lanes)", s.laneMemClients),
		value:     fmt.Sprintf("%.0f B", per),
		reference: "1024 B",
		ratio:     fmt.Sprintf("%.2f", per/1024),
		target:    "< 1 KB",
		verdict:   verdict(per < 1024),
	}}, nil
}

// benchDistinct sends one request each for many distinct clients through the dispatcher
// and checks that, once they are idle, neither the dispatcher nor the server holds
// anything for them: heap (dispatcher and embedded server share this process), lanes,
// and the stream's subjects.
func benchDistinct(ctx context.Context, s settings, log io.Writer) ([]row, error) {
	const dupWindow = 5 * time.Second // the server forgets message ids after this
	n, err := startNode(ctx, false, queue.Config{DuplicateWindow: dupWindow})
	if err != nil {
		return nil, err
	}
	defer n.close()
	var delivered atomic.Int64
	ravenURL, stopRaven, err := serve(fastRaven{arrived: func(string, string, time.Time, time.Time) { delivered.Add(1) }})
	if err != nil {
		return nil, err
	}
	defer stopRaven()
	const interval = 100 * time.Millisecond // lanes are dropped an interval after their last send
	d, stopDispatch, err := startDispatcher(ctx, n, ravenURL, interval)
	if err != nil {
		return nil, err
	}
	defer stopDispatch()
	time.Sleep(interval + 50*time.Millisecond)

	r := distinctRun{ctx: ctx, n: n, d: d, delivered: &delivered, log: log}
	warm := s.distinct / 10
	start := time.Now()
	r.send(0, warm)
	base, err := r.idle(int64(warm), start, dupWindow)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(log, "bench: distinct: %d clients through, idle heap %s\n", warm, mib(base))
	second := time.Now()
	r.send(warm, s.distinct)
	end, err := r.idle(int64(s.distinct), second, dupWindow)
	if err != nil {
		return nil, err
	}
	took := r.sending
	info, err := n.q.Backlog(ctx)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(log, "bench: distinct: %d clients through in %s, idle heap %s, lanes %d, subjects %d\n",
		s.distinct, took.Round(time.Second), mib(end), d.Stats().Lanes, len(info))
	// Flat means nothing is kept per client: a lane is about 160 B, a subject in the
	// server's index or a remembered message id about 100 B; a few bytes per client is
	// noise (allocator and pool sizes, the store's block bookkeeping).
	perClient := (float64(end) - float64(base)) / float64(s.distinct-warm)
	perVerdict := verdict(perClient < 8)
	if s.quick {
		perVerdict = "- (too few clients to judge)"
	}
	return []row{{
		figure:    fmt.Sprintf("heap once idle after %d distinct clientIds (dispatcher + embedded server)", s.distinct),
		value:     mib(end),
		reference: fmt.Sprintf("%s after the first %d", mib(base), warm),
		ratio:     fmt.Sprintf("%.2f", float64(end)/float64(base)),
		target:    "flat",
		verdict:   "see next row",
	}, {
		figure:    "  heap growth per further distinct client, once idle",
		value:     fmt.Sprintf("%.1f B", perClient),
		reference: "~160 B a lane, ~100 B a subject or message id, if any were kept",
		ratio:     "-",
		target:    "< 8 B",
		verdict:   perVerdict,
	}, {
		figure:    "lanes / stream subjects left once idle",
		value:     fmt.Sprintf("%d / %d", d.Stats().Lanes, len(info)),
		reference: fmt.Sprintf("%d clients, %.0f sends/s", s.distinct, float64(s.distinct)/took.Seconds()),
		ratio:     "-",
		target:    "0 / 0",
		verdict:   verdict(d.Stats().Lanes == 0 && len(info) == 0),
	}}, nil
}

// distinctRun sends requests of distinct clients through a dispatcher, and waits for it
// to be idle again.
type distinctRun struct {
	ctx       context.Context
	n         *node
	d         *dispatch.Dispatcher
	delivered *atomic.Int64
	log       io.Writer
	sending   time.Duration // time spent until the last delivery of each phase
}

// send publishes one request for each client numbered from to to, 64 at a time.
func (r *distinctRun) send(from, to int) {
	var wg sync.WaitGroup
	next := atomic.Int64{}
	next.Store(int64(from))
	for range 64 {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < to; i = int(next.Add(1) - 1) {
				c := fmt.Sprintf("distinct-%07d", i)
				if _, err := r.n.q.Publish(r.ctx, request.Request{ID: fmt.Sprint("d", i), ClientID: c, ContentType: "application/json", Body: body(c)}); err != nil {
					fmt.Fprintf(r.log, "bench: publish: %v\n", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// idle waits until want requests were delivered and every lane is gone, then past the
// duplicate window, and returns the heap after a GC.
func (r *distinctRun) idle(want int64, since time.Time, dupWindow time.Duration) (uint64, error) {
	deadline := time.Now().Add(30 * time.Minute)
	for r.delivered.Load() < want {
		if time.Now().After(deadline) || r.ctx.Err() != nil {
			return 0, fmt.Errorf("only %d of %d delivered (lanes %d)", r.delivered.Load(), want, r.d.Stats().Lanes)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.sending += time.Since(since)
	for r.d.Stats().Lanes > 0 {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(dupWindow + 2*time.Second)
	return heapAfterGC(), nil
}
