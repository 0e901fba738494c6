package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// statusReaders is how many callers read statuses at once in benchReads: what issue 35's
// review held against ingest (1,000 keep-alive connections took it from 23 MB to 1.57 GB).
const statusReaders = 1000

// benchReads measures what status reads cost in memory: ingest as the binary serves it
// (events on, the default bounds on reads, a bearer token), with 1,000 callers each
// reading GET /v1/requests/{id} on its own keep-alive connection as fast as answers come,
// from the load generator's process. The figure is the growth of the memory Go holds
// (heap and stacks in use, at the highest while they read, over what was in use before),
// per caller; the reference is the same load on a bare net/http handler that answers 200
// with a small JSON body, measured first in the same run. The process's resident memory
// at its highest is logged beside it.
func benchReads(ctx context.Context, s settings, log io.Writer) ([]row, error) {
	n, err := startNode(ctx, false, queue.Config{})
	if err != nil {
		return nil, err
	}
	defer n.close()
	ev := startEvents(n)
	defer ev.close()
	h, err := benchIngestWith(n, ingest.Config{Live: n.q, Status: n.q})
	if err != nil {
		return nil, err
	}
	bare := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"06h458g8wygkb2ce2kmqz5qfgm","clientId":"reads-1","status":"queued"}`))
	})
	var id string
	measure := func(h http.Handler, ingestPath bool) (perCaller float64, answers int64, err error) {
		url, stop, err := serveProto(h, false)
		if err != nil {
			return 0, 0, err
		}
		defer stop()
		target := url + "/status"
		if ingestPath {
			if id, err = postOne(ctx, url); err != nil {
				return 0, 0, err
			}
			// No dispatcher runs: the request's record is its delivery, the usual one
			// read (its acceptance is not stored, ADR 18).
			ev.w.Record(request.Event{Type: request.EventDelivered, ID: id, ClientID: "reads-1", Seq: 1, Attempt: 1, Status: http.StatusOK})
			if err := ev.w.Flush(ctx); err != nil {
				return 0, 0, err
			}
			target = url + "/v1/requests/" + id + "?clientId=reads-1"
		}
		runtime.GC()
		debug.FreeOSMemory()
		before := inUse()
		peaks := samplePeaks(before)
		res, err := runLoad(ctx, load{Proto: protoHTTP1, Target: target, Workers: statusReaders, For: s.ingestFor, Token: benchToken, Reads: true})
		peak, peakRSS := peaks()
		if err != nil {
			return 0, 0, err
		}
		per := float64(peak-before) / statusReaders / 1024
		fmt.Fprintf(log, "bench: reads (%s): %d answers in %s from %d callers; in use %s before, %s at most (%.1f KiB a caller); RSS at most %s\n",
			map[bool]string{true: "ingest", false: "bare net/http"}[ingestPath], res.Count, s.ingestFor, statusReaders,
			mib(uint64(before)), mib(uint64(peak)), per, mib(uint64(peakRSS)))
		return per, res.Count, nil
	}
	ref, _, err := measure(bare, false)
	if err != nil {
		return nil, err
	}
	per, answers, err := measure(h, true)
	if err != nil {
		return nil, err
	}
	return []row{{
		figure:    fmt.Sprintf("ingest memory growth, %d callers reading statuses at once (keep-alive, events on, fsync every 2 min)", statusReaders),
		value:     fmt.Sprintf("%.1f KiB a caller (%d answers)", per, answers),
		reference: fmt.Sprintf("%.1f KiB a caller, bare net/http handler; 512 KiB a read before issue 35", ref),
		ratio:     fmt.Sprintf("%.2f", per/ref),
		target:    "<= 1.5",
		verdict:   verdict(per/ref <= 1.5),
	}}, nil
}

// samplePeaks samples the memory in use (from before) and the process's RSS every 100
// ms until stop is called, which gives the highest of each.
func samplePeaks(before int64) (stop func() (peak, peakRSS int64)) {
	var high, highRSS atomic.Int64
	high.Store(before)
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				high.Store(max(high.Load(), inUse()))
				highRSS.Store(max(highRSS.Load(), rssBytes()))
			}
		}
	}()
	return func() (int64, int64) {
		close(done)
		<-sampled
		return high.Load(), highRSS.Load()
	}
}

// inUse is the memory Go holds for the process's objects and goroutines: heap spans and
// stacks in use (garbage not yet collected counts: it is what the load makes the
// process hold).
func inUse() int64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse + m.StackInuse)
}

// rssBytes is this process's resident memory, from /proc (0 where there is none).
func rssBytes() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// postOne posts one request to the ingest at url and returns its id.
func postOne(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/requests", bytes.NewReader(body("reads-1")))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+benchToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var a struct{ ID string }
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil || resp.StatusCode != http.StatusAccepted {
		return "", fmt.Errorf("posting a request to read: %d %v", resp.StatusCode, err)
	}
	return a.ID, nil
}
