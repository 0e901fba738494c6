package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/queue"
)

const (
	batchCallers = 8
	batchItems   = 100
)

// benchBatch compares batch ingest over HTTP (POST /v1/requests/batch, events on as in
// the binaries) with raw JetStream publishes from 64 synchronous publishers (fresh
// server each), in both durability modes.
func benchBatch(ctx context.Context, s settings, log io.Writer) ([]row, error) {
	var rows []row
	for _, syncAlways := range []bool{true, false} {
		mode := modeName(syncAlways)
		raw, err := measureRaw(ctx, syncAlways, s.ingestFor)
		if err != nil {
			return rows, err
		}
		rate, events, err := measureBatch(ctx, syncAlways, s.ingestFor)
		if err != nil {
			return rows, err
		}
		fmt.Fprintf(log, "bench: batch (%s): raw %.0f/s, batch items %.0f/s; %s\n", mode, raw, rate, events)
		ratio := rate / raw
		rows = append(rows, row{
			figure:    fmt.Sprintf("batch ingest items stored/s, %d callers, batches of %d x 512 B, events on (%s)", batchCallers, batchItems, mode),
			value:     fmt.Sprintf("%.0f/s", rate),
			reference: fmt.Sprintf("%.0f/s raw JetStream publish (%d synchronous)", raw, ingestWorkers),
			ratio:     fmt.Sprintf("%.2f", ratio),
			target:    ">= 2.0",
			verdict:   verdict(ratio >= 2),
		})
	}
	return rows, nil
}

// measureBatch posts batches to a real ingest API over loopback HTTP, with events and
// statuses on, from batchCallers callers as fast as they can for d. It returns the items
// stored per second, and what the event writer did.
func measureBatch(ctx context.Context, syncAlways bool, d time.Duration) (float64, string, error) {
	n, err := startNode(ctx, syncAlways, queue.Config{})
	if err != nil {
		return 0, "", err
	}
	defer n.close()
	ev := startEvents(n)
	defer ev.close() // once ingest has stopped
	url, stop, err := serveIngest(n, ingest.Config{Events: ev.w, Status: n.q})
	if err != nil {
		return 0, "", err
	}
	defer stop()
	url += "/v1/requests/batch"
	client := httpClient(batchCallers)
	defer client.CloseIdleConnections()
	var count atomic.Int64
	var firstErr atomic.Value
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for c := range batchCallers {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				stored, err := postBatch(client, url, batchOf(c, i))
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				count.Add(int64(stored))
			}
		})
	}
	wg.Wait()
	took := time.Since(start) // the last batches end after the deadline
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, "", err
	}
	return float64(count.Load()) / took.Seconds(), ev.close(), nil
}

// batchOf is caller's i-th batch: a JSON array of batchItems items with 512-byte bodies,
// each for a client of its own (clientFor).
func batchOf(caller, i int) []byte {
	b := []byte{'['}
	for k := range batchItems {
		if k > 0 {
			b = append(b, ',')
		}
		client := clientFor(caller, i*batchItems+k)
		b = fmt.Appendf(b, `{"clientId":%q,"body":%s}`, client, body(client))
	}
	return append(b, ']')
}

// postBatch posts one batch and returns how many of its items were stored; an item that
// was not is an error.
func postBatch(client *http.Client, url string, batch []byte) (int, error) {
	resp, err := client.Post(url, "application/json", bytes.NewReader(batch))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("batch ingest answered %d", resp.StatusCode)
	}
	var ans struct {
		Accepted, Failed int
		Results          []struct {
			Problem *struct{ Code, Detail string }
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil {
		return 0, fmt.Errorf("reading batch ingest's answer: %w", err)
	}
	if ans.Failed > 0 {
		for _, r := range ans.Results {
			if r.Problem != nil {
				return 0, fmt.Errorf("%d of %d items failed, the first: %s (%s)", ans.Failed, len(ans.Results), r.Problem.Code, r.Problem.Detail)
			}
		}
	}
	return ans.Accepted, nil
}
