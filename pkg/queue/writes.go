package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Defaults for WatchWrites.
const (
	DefaultProbeEvery = 2 * time.Second
	probeTimeout      = 5 * time.Second
	// probeTimeoutsToFail is how many test writes in a row must time out before the
	// store is taken for broken: one slow answer under load is not a broken store.
	probeTimeoutsToFail = 2
	// probeSeq is the request stream sequence the test write removes: far past any
	// sequence the stream will reach, so that it never removes a request.
	probeSeq = 1 << 62
)

// writeHealth is what the queue has learnt of the store's writes: from every write it
// makes, and from test writes.
type writeHealth struct {
	broken   atomic.Bool // err != nil: lets a success skip the lock while all is well
	mu       sync.Mutex
	log      zerolog.Logger
	err      error     // why writes fail, nil while they work
	since    time.Time // when they began to fail
	timeouts int       // test writes timed out in a row
}

// note records the outcome of a write. A failure marks the store broken only when it
// says so (a storage error); a success always marks it working.
func (h *writeHealth) note(err error) {
	switch {
	case err == nil:
		if h.broken.Load() {
			h.set(nil)
		}
	case isStoreFailure(err):
		h.set(err)
	}
}

// noteProbe records the outcome of a test write: any failure counts, a timeout only when
// it happens again.
func (h *writeHealth) noteProbe(err error) {
	h.mu.Lock()
	if err != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)) {
		h.timeouts++
		if h.timeouts < probeTimeoutsToFail {
			h.mu.Unlock()
			return
		}
	} else {
		h.timeouts = 0
	}
	h.mu.Unlock()
	h.set(err)
}

// set records the store's state, logging a change once: when writes start failing, with
// the cause, and when they work again.
func (h *writeHealth) set(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err != nil && h.err == nil:
		h.err, h.since = err, time.Now()
		h.broken.Store(true)
		h.log.Error().Err(err).Msg("the queue's store does not take writes; not ready until it does")
	case err != nil:
		h.err = err
	case h.err != nil:
		h.log.Info().Dur("after", time.Since(h.since)).Msg("the queue's store takes writes again")
		h.err, h.timeouts = nil, 0
		h.broken.Store(false)
	}
}

func (h *writeHealth) get() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// isStoreFailure says whether a write's error means the store could not write (a full
// disk, a broken store), as opposed to a limit, a timeout or a lost connection.
func isStoreFailure(err error) bool {
	if errors.Is(err, request.ErrBacklogFull) || errors.Is(err, request.ErrQueueFull) {
		return false
	}
	var apiErr *jetstream.APIError
	return strings.Contains(err.Error(), "no space left") ||
		(errors.As(err, &apiErr) && apiErr.Code >= 500 && apiErr.ErrorCode != errCodeInsufficientResources)
}

// WriteErr says why the store does not take writes now, as far as this queue has seen
// (and its store guard, when the server runs in this process); nil when it does.
func (q *Queue) WriteErr() error {
	if !q.writes.broken.Load() && (q.guard == nil || !q.guard.broken.Load()) {
		return nil // the common case, without a lock: it is asked on every publish
	}
	if q.guard != nil {
		if err := q.guard.Err(); err != nil {
			return err
		}
	}
	return q.writes.get()
}

// UseGuard makes WriteErr and Ready report what g knows of the store too: the queue's
// server runs in this process, guarded by g.
func (q *Queue) UseGuard(g *StoreGuard) { q.guard = g }

// probeWrite is the test write: the removal of a request that does not exist from the
// request stream. A store that cannot write answers it with its write error (nats-server
// keeps the error of a failed write and returns it for every later change to the
// stream), a healthy one with "stream store EOF" or "not found"; on a cluster the
// removal also goes through the stream's replication, a write on every replica.
func (q *Queue) probeWrite(ctx context.Context) error {
	err := q.reqs.DeleteMsg(ctx, probeSeq)
	if err == nil || isNotFound(err) || strings.Contains(err.Error(), "stream store EOF") {
		return nil
	}
	return fmt.Errorf("test write to stream %s: %w", RequestStream, err)
}

// WatchWrites makes a test write every interval (DefaultProbeEvery if zero) until ctx
// ends, so that WriteErr and Ready know whether the store takes writes even while no
// request is written, and logs to log when that changes (unless a StoreGuard, which
// knows more, does).
func (q *Queue) WatchWrites(ctx context.Context, every time.Duration, log zerolog.Logger) {
	if every <= 0 {
		every = DefaultProbeEvery
	}
	if q.guard == nil {
		q.writes.mu.Lock()
		q.writes.log = log.With().Str("component", "queue").Logger()
		q.writes.mu.Unlock()
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if q.nc.IsConnected() { // a lost connection is Ready's to report, not a store fault
			pctx, cancel := context.WithTimeout(ctx, probeTimeout)
			err := q.probeWrite(pctx)
			cancel()
			if ctx.Err() != nil {
				return
			}
			q.writes.noteProbe(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// WritesCollector is a gauge for Prometheus: 1 while the store takes writes, else 0.
func (q *Queue) WritesCollector() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "dispatch_queue_writable",
		Help: "1 while the JetStream store takes writes, as this instance sees it (its writes and a test write every few seconds), else 0: then /readyz says not ready and the log says why.",
	}, func() float64 {
		if q.WriteErr() != nil {
			return 0
		}
		return 1
	})
}
