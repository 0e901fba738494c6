package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/queue"
)

// benchIdle measures, for clients with no backlog, the time from ingest's 202 to raven
// receiving the request (one JetStream round trip and one HTTP request, no timer tick).
func benchIdle(ctx context.Context, s settings, log io.Writer) ([]row, error) {
	n, err := startNode(ctx, true, queue.Config{})
	if err != nil {
		return nil, err
	}
	defer n.close()
	var mu sync.Mutex
	arrivals := map[string]time.Time{}
	got := make(chan struct{}, s.idleRequests)
	ravenURL, stopRaven, err := serve(fastRaven{arrived: func(_, id string, at, _ time.Time) {
		mu.Lock()
		arrivals[id] = at
		mu.Unlock()
		got <- struct{}{}
	}})
	if err != nil {
		return nil, err
	}
	defer stopRaven()
	_, stopDispatch, err := startDispatcher(ctx, n, ravenURL, time.Second)
	if err != nil {
		return nil, err
	}
	defer stopDispatch()
	url, stopIngest, err := serveIngest(n, ingest.Config{})
	if err != nil {
		return nil, err
	}
	defer stopIngest()
	time.Sleep(1100 * time.Millisecond) // past the dispatcher's start-up fence

	accepted := map[string]time.Time{}
	for i := range s.idleRequests {
		resp, err := http.Post(url+"/v1/requests", "application/json", bytes.NewReader(body(fmt.Sprintf("idle-%06d", i))))
		if err != nil {
			return nil, err
		}
		at := time.Now()
		var a struct{ ID string }
		err = json.NewDecoder(resp.Body).Decode(&a)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusAccepted {
			return nil, fmt.Errorf("ingest answered %d (%v)", resp.StatusCode, err)
		}
		accepted[a.ID] = at
		time.Sleep(20 * time.Millisecond)
	}
	timeout := time.After(30 * time.Second)
	for range s.idleRequests {
		select {
		case <-got:
		case <-timeout:
			return nil, fmt.Errorf("not every idle request reached raven")
		}
	}
	var lat samples
	mu.Lock()
	for id, at := range accepted {
		lat.add(arrivals[id].Sub(at))
	}
	mu.Unlock()
	q := lat.quantiles(0.5, 0.99)
	fmt.Fprintf(log, "bench: idle latency p50 %s p99 %s\n", q[0], q[1])
	rows := []row{{
		figure:    "idle client: ingest 202 to raven receiving, p50 / p99",
		value:     ms(q[0]) + " / " + ms(q[1]),
		reference: fmt.Sprintf("%d requests", lat.len()),
		ratio:     "-",
		target:    "p99 < 10 ms",
		verdict:   verdict(q[1] < 10*time.Millisecond),
	}}
	r, err := benchPreferWait(ctx, s, log)
	return append(rows, r...), err
}

// benchPreferWait measures what Prefer: wait adds to raven's own time for clients with
// no backlog, with the binaries' defaults (events on, fsync on every write): a POST's
// round trip to its 200, less the time raven took over the request (from its arrival to
// its answer). What is left is ingest's store, the dispatcher's pick-up and send, the
// delivered event and the removal, and the waiting POST hearing of it.
func benchPreferWait(ctx context.Context, s settings, log io.Writer) ([]row, error) {
	n, err := startNode(ctx, true, queue.Config{})
	if err != nil {
		return nil, err
	}
	defer n.close()
	ev := startEvents(n)
	defer ev.close()
	var mu sync.Mutex
	ravenTook := map[string]time.Duration{}
	ravenURL, stopRaven, err := serve(fastRaven{answer: jsonAnswer(128), arrived: func(_, id string, at, answered time.Time) {
		mu.Lock()
		ravenTook[id] = answered.Sub(at)
		mu.Unlock()
	}})
	if err != nil {
		return nil, err
	}
	defer stopRaven()
	_, stopDispatch, err := startDispatcher(ctx, n, ravenURL, time.Second, ev.on)
	if err != nil {
		return nil, err
	}
	defer stopDispatch()
	url, stopIngest, err := serveIngest(n, ingest.Config{Live: n.q, Status: n.q})
	if err != nil {
		return nil, err
	}
	defer stopIngest()
	time.Sleep(1100 * time.Millisecond) // past the dispatcher's start-up fence
	hc := httpClient(1)
	var added, plain samples
	for i := range s.idleRequests {
		// The reference, interleaved: a POST without Prefer to an idle client of its own,
		// its 202: the store every POST waits for, which a waiting one waits for too.
		took, err := postPlain(hc, url, fmt.Sprintf("plain-%06d", i))
		if err != nil {
			return nil, err
		}
		plain.add(took)
		time.Sleep(20 * time.Millisecond) // its delivery is over
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/requests", bytes.NewReader(body(fmt.Sprintf("wait-%06d", i))))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Prefer", "wait=10")
		start := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		var st struct {
			ID       string
			Status   string
			Response *struct{ Status int }
		}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		took = time.Since(start)
		if err != nil || resp.StatusCode != http.StatusOK || st.Status != "delivered" || st.Response == nil {
			return nil, fmt.Errorf("a waiting POST was answered %d %+v (%v), want 200 delivered with raven's answer", resp.StatusCode, st, err)
		}
		mu.Lock()
		added.add(took - ravenTook[st.ID])
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	q, ref := added.quantiles(0.5, 0.99), plain.quantiles(0.5, 0.99)
	fmt.Fprintf(log, "bench: Prefer: wait adds p50 %s p99 %s to raven's own time; a POST's 202 without it takes p50 %s p99 %s\n", q[0], q[1], ref[0], ref[1])
	return []row{{
		figure:    "idle client, POST with Prefer: wait: its 200 less raven's own time, p50 / p99 (defaults: events on, fsync every write)",
		value:     ms(q[0]) + " / " + ms(q[1]),
		reference: fmt.Sprintf("%d requests, one at a time; a POST's 202 without it, interleaved: %s / %s", added.len(), ms(ref[0]), ms(ref[1])),
		ratio:     "-",
		target:    "p99 <= 5 ms",
		verdict:   verdict(q[1] <= 5*time.Millisecond),
	}}, nil
}

// postPlain posts a request for client without Prefer, and says how long its 202 took.
func postPlain(hc *http.Client, url, client string) (time.Duration, error) {
	start := time.Now()
	resp, err := hc.Post(url+"/v1/requests", "application/json", bytes.NewReader(body(client)))
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return 0, fmt.Errorf("a plain POST was answered %d, want 202", resp.StatusCode)
	}
	return time.Since(start), nil
}
