package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// The load generator runs in a process of its own (this binary, run as "bench
// loadgen"), so that the process serving the load is measured alone: the callers' own
// work (building requests, reading answers) is not charged to the server, and it is the
// same for every server compared.

// Load generator protocols.
const (
	protoHTTP1 = "http1" // 64 connections, one request at a time on each
	protoH2C   = "h2c"   // HTTP/2 without TLS: every caller on one connection
	protoNATS  = "nats"  // raw JetStream publishes, as ingest makes them
)

// load is what to offer: workers callers, for d, as fast as they can (rate 0) or at rate
// requests per second in all.
type load struct {
	Proto   string
	Target  string // an HTTP URL, or a NATS URL for protoNATS
	Workers int
	For     time.Duration
	Rate    float64
	Token   string // sent as a bearer token when not empty
	// Batch, when above 0, posts batches of that many items to Target (the batch
	// endpoint) instead of single requests, and counts the items stored.
	Batch int
	// Reads, when set, reads Target (a status) instead of posting: an answer counts when
	// it is 200, or 503 overloaded (the bound on reads at once, doing its job).
	Reads bool
}

// loadResult is what the load generator prints: requests answered as expected, and the
// latency quantiles of those (when a rate was given).
type loadResult struct {
	Count int64         `json:"count"`
	P50   time.Duration `json:"p50"`
	P99   time.Duration `json:"p99"`
	Err   string        `json:"err,omitempty"`

	serverCPU time.Duration // the server process's CPU while the load ran (set by the caller)
}

func (r loadResult) rate(d time.Duration) float64 { return float64(r.Count) / d.Seconds() }

// runLoad runs the load generator process and returns what it measured.
func runLoad(ctx context.Context, l load) (loadResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return loadResult{}, err
	}
	cmd := exec.CommandContext(ctx, exe, "loadgen", "-proto", l.Proto, "-target", l.Target,
		"-workers", strconv.Itoa(l.Workers), "-for", l.For.String(),
		"-rate", strconv.FormatFloat(l.Rate, 'f', 1, 64), "-token", l.Token, "-batch", strconv.Itoa(l.Batch), "-reads="+strconv.FormatBool(l.Reads))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return loadResult{}, fmt.Errorf("load generator: %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	var res loadResult
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		return loadResult{}, fmt.Errorf("load generator printed %q: %w", stdout.String(), err)
	}
	if res.Err != "" {
		return res, fmt.Errorf("load generator (%s %s): %s", l.Proto, l.Target, res.Err)
	}
	return res, nil
}

// loadgenMain is the load generator process: it offers the load its flags describe and
// prints a loadResult as JSON.
func loadgenMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var l load
	fs.StringVar(&l.Proto, "proto", protoHTTP1, "http1, h2c or nats")
	fs.StringVar(&l.Target, "target", "", "the URL to post to, or the NATS URL")
	fs.IntVar(&l.Workers, "workers", ingestWorkers, "concurrent callers")
	fs.DurationVar(&l.For, "for", 5*time.Second, "how long to offer load")
	fs.Float64Var(&l.Rate, "rate", 0, "requests per second in all; 0: as fast as answers come")
	fs.StringVar(&l.Token, "token", "", "bearer token to send")
	fs.IntVar(&l.Batch, "batch", 0, "items per batch, posted to the batch endpoint; 0: single requests")
	fs.BoolVar(&l.Reads, "reads", false, "read the target (GET) instead of posting to it")
	if err := fs.Parse(args); err != nil {
		return err
	}
	res := offer(ctx, l)
	return json.NewEncoder(stdout).Encode(res)
}

// offer offers l and measures it.
func offer(ctx context.Context, l load) loadResult {
	send, closeSend, err := sender(l)
	if err != nil {
		return loadResult{Err: err.Error()}
	}
	defer closeSend()
	var count atomic.Int64
	var firstErr atomic.Value
	var lat samples
	start := time.Now()
	deadline := start.Add(l.For)
	var wg sync.WaitGroup
	for w := range l.Workers {
		wg.Go(func() {
			var every time.Duration
			if l.Rate > 0 {
				every = time.Duration(float64(l.Workers) / l.Rate * float64(time.Second))
			}
			next := start.Add(time.Duration(w) * every / time.Duration(l.Workers))
			for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				if every > 0 {
					time.Sleep(time.Until(next))
					next = next.Add(every)
				}
				t0 := time.Now()
				n, err := send(ctx, w, i)
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				if l.Rate > 0 {
					lat.add(time.Since(t0))
				}
				count.Add(int64(n))
			}
		})
	}
	wg.Wait()
	res := loadResult{Count: count.Load()}
	if err, _ := firstErr.Load().(error); err != nil {
		res.Err = err.Error()
	}
	if l.Rate > 0 {
		q := lat.quantiles(0.5, 0.99)
		res.P50, res.P99 = q[0], q[1]
	}
	return res
}

// sender returns the function that sends worker w's i-th request (or batch) under l and
// says how many requests were stored.
func sender(l load) (func(ctx context.Context, w, i int) (int, error), func(), error) {
	if l.Proto == protoNATS {
		nc, err := nats.Connect(l.Target)
		if err != nil {
			return nil, nil, err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return nil, nil, err
		}
		send := func(ctx context.Context, w, i int) (int, error) {
			client := clientFor(w, i)
			msg := nats.NewMsg(request.RequestSubject(client))
			msg.Header.Set(request.HeaderContentType, "application/json")
			msg.Data = body(client)
			_, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID(fmt.Sprint(w, "-", i)), jetstream.WithExpectStream(queue.RequestStream))
			return 1, err
		}
		return send, nc.Close, nil
	}
	tr := &http.Transport{MaxIdleConnsPerHost: l.Workers, MaxIdleConns: l.Workers}
	switch l.Proto {
	case protoHTTP1:
	case protoH2C:
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetUnencryptedHTTP2(true)
	default:
		return nil, nil, fmt.Errorf("unknown protocol %q", l.Proto)
	}
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	next := func(w, i int) []byte { return body(clientFor(w, i)) }
	if l.Batch > 0 {
		// Built before the load starts, so that building them costs the callers nothing
		// while it runs: enough per caller to cycle through its thousand clients.
		batches := make([][][]byte, l.Workers)
		for w := range batches {
			for k := range max(1000/l.Batch, 1) {
				batches[w] = append(batches[w], batchOf(w, k, l.Batch))
			}
		}
		next = func(w, i int) []byte { return batches[w][i%len(batches[w])] }
	}
	send := func(ctx context.Context, w, i int) (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.Target, bytes.NewReader(next(w, i)))
		if l.Reads {
			req, err = http.NewRequestWithContext(ctx, http.MethodGet, l.Target, nil)
		}
		if err != nil {
			return 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		if l.Token != "" {
			req.Header.Set("Authorization", "Bearer "+l.Token)
		}
		resp, err := client.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return 0, nil
			}
			return 0, err
		}
		defer resp.Body.Close()
		if l.Batch > 0 {
			return batchStored(resp)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		if l.Reads && (resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusServiceUnavailable) {
			return 1, nil
		}
		if resp.StatusCode != http.StatusAccepted {
			return 0, fmt.Errorf("answered %d", resp.StatusCode)
		}
		return 1, nil
	}
	return send, client.CloseIdleConnections, nil
}
