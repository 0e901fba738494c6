package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// watchInstances is how many dispatchers the watch scenario shares the partitions among.
const watchInstances = 4

// benchWatch measures what the dispatchers' backlog watches cost per request stored as
// the instances scale out: watchInstances watches each over every partition (each
// instance sent every request's headers, as before the watch followed the partitions an
// instance owns), against the same number each over its share, against no watch. It
// is a design measurement: the queue's watch itself on an embedded server (fsync every
// 2 min, so that the writes do not drown the difference), not the binaries; interleaved
// rounds, the median of each.
func benchWatch(ctx context.Context, s settings, log io.Writer) ([]row, error) {
	rounds, n := 5, 100_000
	if s.quick {
		rounds, n = 1, 4_000
	}
	kinds := []string{"none", "every", "share"}
	cpu := map[string][]float64{}
	for range rounds {
		for _, k := range kinds {
			us, err := measureWatch(ctx, k, n)
			if err != nil {
				return nil, fmt.Errorf("watch (%s): %w", k, err)
			}
			fmt.Fprintf(log, "bench: watch (%s): %.1f us of CPU per request stored\n", k, us)
			cpu[k] = append(cpu[k], us)
		}
	}
	none, every, share := median(cpu["none"]), median(cpu["every"]), median(cpu["share"])
	ratio := (share - none) / (every - none)
	return []row{{
		figure:    fmt.Sprintf("watch: CPU per request stored, %d dispatchers' backlog watches each over its share of the partitions (design measurement: embedded server, fsync every 2 min)", watchInstances),
		value:     fmt.Sprintf("%.1f us (%.1f us over no watch)", share, share-none),
		reference: fmt.Sprintf("%.1f us each over every partition (%.1f us over none); %.1f us no watch; %d requests, median of %d rounds", every, every-none, none, n, rounds),
		ratio:     fmt.Sprintf("%.2f", ratio),
		target:    fmt.Sprintf("<= %.2f (ideal %.2f)", 1.6/watchInstances, 1.0/watchInstances),
		verdict:   verdict(ratio <= 1.6/watchInstances),
	}}, nil
}

// measureWatch stores n requests over 1,000 clients on a fresh node, from 8 publishers
// of 100 at a time, with watchInstances watches of kind ("none", "every": each over
// every partition, "share": each over its share), and returns the CPU this process (the
// server with it) took per request until every watch had been given its requests.
func measureWatch(ctx context.Context, kind string, n int) (float64, error) {
	nd, err := startNode(ctx, false, queue.Config{})
	if err != nil {
		return 0, err
	}
	defer nd.close()
	var got atomic.Int64
	want := int64(n)
	if kind == "every" {
		want *= watchInstances
	}
	all := make(chan struct{})
	note := func(request.Lane) {
		if got.Add(1) == want {
			close(all)
		}
	}
	if kind != "none" {
		for i := range watchInstances {
			var ps []int
			for p := range nd.q.Partitions() {
				if kind == "every" || p%watchInstances == i {
					ps = append(ps, p)
				}
			}
			stop, err := nd.q.Watch(ctx, ps, note, func(error) {})
			if err != nil {
				return 0, err
			}
			defer stop()
		}
	}
	reqs := make([]request.Request, n)
	for i := range reqs {
		client := clientFor(i%8, i)
		reqs[i] = request.Request{ID: request.NewID(time.Now()), ClientID: client, Body: body(client), ContentType: "application/json"}
	}
	before := cpuTime()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := w * 100; i < n; i += 800 {
				if _, es := nd.q.PublishAll(ctx, reqs[i:min(i+100, n)]); es != nil {
					for _, e := range es {
						if e != nil {
							errs <- e
							return
						}
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	if kind != "none" {
		select {
		case <-all:
		case <-time.After(time.Minute):
			return 0, fmt.Errorf("the watches were given %d of %d requests in a minute", got.Load(), want)
		}
	}
	return float64(cpuTime()-before) / float64(time.Microsecond) / float64(n), nil
}
