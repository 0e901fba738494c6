package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

const (
	ingestWorkers = 64
	bodySize      = 512
)

// body is a 512-byte JSON request for client.
func body(client string) []byte {
	head := fmt.Sprintf(`{"clientId":%q,"pad":"`, client)
	return []byte(head + strings.Repeat("x", bodySize-len(head)-2) + `"}`)
}

// clientFor spreads a worker's requests over a thousand clients of its own, so that no
// client's backlog cap is reached.
func clientFor(worker, i int) string { return fmt.Sprintf("w%02d-c%04d", worker, i%1000) }

// benchIngest compares HTTP ingest with raw JetStream publishes (same durability, same
// concurrency, fresh server each), in both durability modes.
func benchIngest(ctx context.Context, s settings, log io.Writer) ([]row, error) {
	var rows []row
	for _, syncAlways := range []bool{true, false} {
		mode := modeName(syncAlways)
		raw, err := measureRaw(ctx, syncAlways, s.ingestFor)
		if err != nil {
			return rows, err
		}
		httpRate, err := measureHTTP(ctx, syncAlways, s.ingestFor, 0, nil)
		if err != nil {
			return rows, err
		}
		fmt.Fprintf(log, "bench: ingest (%s): raw %.0f/s, http %.0f/s\n", mode, raw, httpRate)
		ratio := httpRate / raw
		rows = append(rows, row{
			figure:    fmt.Sprintf("ingest accepted/s, 64 clients, 512 B (%s)", mode),
			value:     fmt.Sprintf("%.0f/s", httpRate),
			reference: fmt.Sprintf("%.0f/s raw JetStream publish", raw),
			ratio:     fmt.Sprintf("%.2f", ratio),
			target:    ">= 0.60",
			verdict:   verdict(ratio >= 0.6),
		})
		var lat samples
		if _, err := measureHTTP(ctx, syncAlways, s.ingestFor, httpRate/2, &lat); err != nil {
			return rows, err
		}
		q := lat.quantiles(0.5, 0.99)
		rows = append(rows, row{
			figure:    fmt.Sprintf("ingest latency p50 / p99 at half that load (%s)", mode),
			value:     ms(q[0]) + " / " + ms(q[1]),
			reference: fmt.Sprintf("%.0f/s offered", httpRate/2),
			ratio:     "-", target: "-", verdict: "-",
		})
	}
	return rows, nil
}

// measureRaw publishes with nats.go's JetStream client straight to the request stream,
// as ingest does (message id, expected stream), and returns publishes per second.
func measureRaw(ctx context.Context, syncAlways bool, d time.Duration) (float64, error) {
	n, err := startNode(ctx, syncAlways, queue.Config{})
	if err != nil {
		return 0, err
	}
	defer n.close()
	js, err := jetstream.New(n.nc)
	if err != nil {
		return 0, err
	}
	var count atomic.Int64
	var firstErr atomic.Value
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := range ingestWorkers {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				client := clientFor(w, i)
				msg := nats.NewMsg("dispatch.req." + request.EncodeClientID(client))
				msg.Header.Set(request.HeaderContentType, "application/json")
				msg.Data = body(client)
				if _, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID(fmt.Sprint(w, "-", i)), jetstream.WithExpectStream(queue.RequestStream)); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				count.Add(1)
			}
		})
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, err
	}
	return float64(count.Load()) / d.Seconds(), nil
}

// measureHTTP posts to a real ingest API over loopback HTTP. With rate 0 the 64 workers
// go as fast as they can; otherwise they offer rate requests per second in all and record
// each request's latency into lat.
func measureHTTP(ctx context.Context, syncAlways bool, d time.Duration, rate float64, lat *samples) (float64, error) {
	n, err := startNode(ctx, syncAlways, queue.Config{})
	if err != nil {
		return 0, err
	}
	defer n.close()
	url, stop, err := serveIngest(n, ingest.Config{})
	if err != nil {
		return 0, err
	}
	defer stop()
	url += "/v1/requests"
	client := httpClient(ingestWorkers)
	var count atomic.Int64
	var firstErr atomic.Value
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for w := range ingestWorkers {
		wg.Go(func() {
			var every time.Duration
			if rate > 0 {
				every = time.Duration(float64(ingestWorkers) / rate * float64(time.Second))
			}
			next := start.Add(time.Duration(w) * every / ingestWorkers)
			for i := 0; time.Now().Before(deadline); i++ {
				if every > 0 {
					time.Sleep(time.Until(next))
					next = next.Add(every)
				}
				t0 := time.Now()
				resp, err := client.Post(url, "application/json", bytes.NewReader(body(clientFor(w, i))))
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusAccepted {
					firstErr.CompareAndSwap(nil, fmt.Errorf("ingest answered %d", resp.StatusCode))
					return
				}
				if lat != nil {
					lat.add(time.Since(t0))
				}
				count.Add(1)
			}
		})
	}
	wg.Wait()
	client.CloseIdleConnections()
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, err
	}
	return float64(count.Load()) / d.Seconds(), nil
}
