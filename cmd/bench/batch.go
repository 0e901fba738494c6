package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/queue"
)

const (
	batchCallers = 8
	batchItems   = 100
)

// benchBatch compares batch ingest over HTTP (POST /v1/requests/batch, as the binary
// serves it: a bearer token, metrics) with raw JetStream publishes from 64 synchronous
// publishers, in both durability modes. Every figure comes from the out-of-process load
// generator (batchCallers callers, batches built before the load starts), a fresh server
// each time, in interleaved rounds: raw publishes, batches with events off (the ratio's
// row, as the single-request rows run: events' cost is the events rows'), and batches
// with events on, as the binaries run by default.
func benchBatch(ctx context.Context, s settings, log io.Writer) ([]row, error) {
	const (
		kindBatch       = "batch"
		kindBatchEvents = "batch, events on"
	)
	var rows []row
	for _, syncAlways := range []bool{true, false} {
		mode := modeName(syncAlways)
		got := map[string][]float64{}
		cpu := map[string][]float64{}
		for round := range s.ingestRounds {
			kinds := []string{kindRaw, kindBatch, kindBatchEvents}
			if round%2 == 1 {
				slices.Reverse(kinds)
			}
			for _, kind := range kinds {
				var res loadResult
				var err error
				if kind == kindRaw {
					res, err = measureKind(ctx, kindRaw, syncAlways, load{Workers: ingestWorkers, For: s.ingestFor})
				} else {
					res, err = measureBatch(ctx, syncAlways, kind == kindBatchEvents, s.ingestFor)
				}
				if err != nil {
					return rows, fmt.Errorf("%s (%s): %w", kind, mode, err)
				}
				got[kind] = append(got[kind], res.rate(s.ingestFor))
				cpu[kind] = append(cpu[kind], float64(res.serverCPU.Microseconds())/float64(max(res.Count, 1)))
			}
			fmt.Fprintf(log, "bench: batch (%s) round %d: raw %.0f/s (%.1f us CPU each); batch items %.0f/s (%.1f us); with events on %.0f/s (%.1f us)\n",
				mode, round+1, got[kindRaw][round], cpu[kindRaw][round], got[kindBatch][round], cpu[kindBatch][round], got[kindBatchEvents][round], cpu[kindBatchEvents][round])
		}
		ratioOf := func(a, b string) float64 {
			var rs []float64
			for i := range got[a] {
				rs = append(rs, got[a][i]/got[b][i])
			}
			return median(rs)
		}
		ratio := ratioOf(kindBatchEvents, kindRaw)
		rows = append(rows,
			row{
				figure:    fmt.Sprintf("batch ingest items stored/s, %d callers, batches of %d x 512 B, the binaries' defaults (events on; %s)", batchCallers, batchItems, mode),
				value:     fmt.Sprintf("%.0f/s", median(got[kindBatchEvents])),
				reference: fmt.Sprintf("%.0f/s raw JetStream publish (%d synchronous)", median(got[kindRaw]), ingestWorkers),
				ratio:     fmt.Sprintf("%.2f", ratio),
				target:    ">= 2.0",
				verdict:   verdict(ratio >= 2),
			},
			row{
				figure:    fmt.Sprintf("  the same with events off, not the default (%s)", mode),
				value:     fmt.Sprintf("%.0f/s", median(got[kindBatch])),
				reference: fmt.Sprintf("%.0f/s raw; server CPU per item %.1f us, %.1f us events on, %.1f us raw", median(got[kindRaw]), median(cpu[kindBatch]), median(cpu[kindBatchEvents]), median(cpu[kindRaw])),
				ratio:     fmt.Sprintf("%.2f", ratioOf(kindBatch, kindRaw)),
				target:    "-", verdict: "-",
			})
	}
	return rows, nil
}

// measureBatch serves the ingest on a fresh node (its events written, when events) and
// has the load generator post batches to it for d.
func measureBatch(ctx context.Context, syncAlways, events bool, d time.Duration) (loadResult, error) {
	n, err := startNode(ctx, syncAlways, queue.Config{})
	if err != nil {
		return loadResult{}, err
	}
	defer n.close()
	cfg := ingest.Config{}
	if events {
		cfg.Live, cfg.Status = n.q, n.q
	}
	h, err := benchIngestWith(n, cfg)
	if err != nil {
		return loadResult{}, err
	}
	url, stop, err := serveProto(h, false)
	if err != nil {
		return loadResult{}, err
	}
	defer stop()
	l := load{Proto: protoHTTP1, Target: url + "/v1/requests/batch", Workers: batchCallers, For: d, Token: benchToken, Batch: batchItems}
	before := cpuTime()
	res, err := runLoad(ctx, l)
	res.serverCPU = cpuTime() - before
	return res, err
}

// batchOf is caller's k-th batch: a JSON array of n items with 512-byte bodies, each for
// a client of its own (clientFor).
func batchOf(caller, k, n int) []byte {
	b := []byte{'['}
	for j := range n {
		if j > 0 {
			b = append(b, ',')
		}
		client := clientFor(caller, k*n+j)
		b = fmt.Appendf(b, `{"clientId":%q,"body":%s}`, client, body(client))
	}
	return append(b, ']')
}

// batchStored reads a batch's answer and returns how many of its items were stored; an
// item that was not is an error.
func batchStored(resp *http.Response) (int, error) {
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
