package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Defaults for WatchWrites.
const (
	DefaultProbeEvery = 2 * time.Second
	probeTimeout      = 2 * time.Second
	minProbeGap       = 100 * time.Millisecond
	// unansweredToMove is how many test writes in a row must get no answer through the
	// server this service is connected to before it moves to another one: a server cut
	// off from its cluster's majority keeps its clients but cannot serve JetStream.
	unansweredToMove = 3
	// probeSeq is the sequence the test write removes (from the request stream, or the
	// health stream): far past any sequence a stream will reach, so that it never
	// removes a request (or a marker).
	probeSeq = 1 << 62
)

// writeHealth is what the queue has learnt of the store's writes: from every write it
// makes, and from test writes.
type writeHealth struct {
	broken     atomic.Bool // err != nil: lets a success skip the lock while all is well
	mu         sync.Mutex
	log        zerolog.Logger
	err        error     // why writes fail, nil while they work
	since      time.Time // when they began to fail
	unanswered bool      // the last test write got no answer (said once)
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

// noteProbe records the outcome of a test write: a storage error marks the store
// broken, a success working. A test write without an answer (a timeout, no responders,
// a permission denied) says nothing of the store: a stream without a leader for a moment,
// or a user not allowed to make the test write, must not make every service refuse
// requests. It is logged once until a test write succeeds again.
func (h *writeHealth) noteProbe(err error) {
	if err == nil || isStoreFailure(err) {
		h.mu.Lock()
		h.unanswered = false
		h.mu.Unlock()
		h.set(err)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.unanswered {
		h.unanswered = true
		h.log.Warn().Err(err).Msg("the test write of the queue's store got no answer; it cannot tell whether the store takes writes (the NATS user needs its role's permissions: pkg/queue/permissions.go)")
	}
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
		h.err = nil
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
	// nats.go flattens a failed removal's answer into text: "code=500" is the server
	// failing to write, as apiErr.Code is for a publish.
	var apiErr *jetstream.APIError
	text := err.Error()
	return strings.Contains(text, "no space left") || strings.Contains(text, "code=500") ||
		(errors.As(err, &apiErr) && apiErr.Code >= 500 && apiErr.ErrorCode != errCodeInsufficientResources)
}

// WriteErr says why the store does not take writes now, as far as this queue has seen
// (and its store guard, when the server runs in this process); nil when it does.
func (q *Queue) WriteErr() error {
	if !q.writes.broken.Load() && (q.guard == nil || !q.guard.Broken()) {
		return nil // the common case, without a lock: it is asked on every publish
	}
	if q.guard != nil {
		if err := q.guard.Err(); err != nil {
			return err
		}
	}
	return q.writes.get()
}

// UseGuard makes WriteErr and Ready report what g knows of the store too (the queue's
// server runs in this process, guarded by g), and g hear of the storage errors this
// queue's writes meet: they are what tells it of a store that failed on a removal.
func (q *Queue) UseGuard(g StoreGuard) {
	q.guard = g
	g.HearClients(q.writes.get)
}

// StoreGuard watches the store of a NATS server running in this process
// (natsnode.StoreGuard).
type StoreGuard interface {
	// Err says why the store cannot take writes now; nil when it can.
	Err() error
	// Broken says whether Err is not nil, cheaply: it is asked on every write.
	Broken() bool
	// HearClients gives the guard what the queue's writes met: a store that failed on a
	// removal shows in its clients' answers, not in the server's health check.
	HearClients(func() error)
}

// probeWrite is the test write: a marker in the health stream for a queue whose user may
// not remove requests (Config.HealthRole, probeHealth), else the removal of a request
// that does not exist from the request stream. A store that cannot write answers that
// removal with its write error (nats-server keeps the error of a failed write and returns
// it for every later change to the stream), a healthy one with "stream store EOF" or "not
// found"; on a cluster the removal also goes through the stream's replication, a write on
// every replica, which is what proves the link head reads go through (link.go). Each
// waits probeTimeout at most for an answer.
func (q *Queue) probeWrite(ctx context.Context) error {
	if q.cfg.HealthRole != "" {
		if q.health == nil {
			return fmt.Errorf("test write: stream %s not opened", HealthStream)
		}
		return q.probeHealth(ctx, q.cfg.HealthRole)
	}
	return removeMissing(ctx, q.reqs, RequestStream)
}

// WatchWrites makes a test write every interval (DefaultProbeEvery if zero) until ctx
// ends, so that WriteErr and Ready know whether the store takes writes even while no
// request is written, and logs to log when that changes (unless a StoreGuard, which
// knows more, does). The test write (probeWrite) needs the right to remove messages from
// the request stream ($JS.API.STREAM.MSG.DELETE.REQUESTS, the dispatcher's), or with
// Config.HealthRole to write to that role's health subject and remove from the health
// stream (ingest's); without it, it gets no answer, which is logged once and otherwise
// ignored. The removals from the request stream also prove the link Head reads through
// once ProveHeadReads was called (link.go), at once when a head read asks; the health
// stream's writes do not (they go through another stream's leader).
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
	unanswered, last := 0, time.Time{}
	for {
		// Head reads ask for test writes as they need them; a store that fails every
		// write at once still gets them no more often than this.
		time.Sleep(time.Until(last.Add(minProbeGap)))
		last = time.Now()
		if q.nc.IsConnected() { // a lost connection is Ready's to report, not a store fault
			link := q.link()
			err := q.probeWrite(ctx)
			if ctx.Err() != nil {
				return
			}
			q.writes.noteProbe(err)
			switch {
			case q.cfg.HealthRole != "": // not a write to the request stream: no proof
			case err == nil:
				q.writeLanded(link)
			case !isStoreFailure(err):
				q.writeUnanswered(link)
			}
			if err == nil || isStoreFailure(err) {
				unanswered = 0
			} else if unanswered++; unanswered >= unansweredToMove && len(q.nc.Servers()) > 1 {
				unanswered = 0
				log.Warn().Err(err).Str("server", q.nc.ConnectedUrlRedacted()).
					Msg("JetStream does not answer through this NATS server; connecting to another one of the cluster")
				_ = q.nc.ForceReconnect()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-q.proof.kick: // a head read waits for a write through a new link
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
