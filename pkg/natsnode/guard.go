package natsnode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Defaults for StoreGuard.
const (
	DefaultGuardEvery   = 500 * time.Millisecond
	guardProbeEvery     = 2 * time.Second // how often the file system is tried while all is well
	guardRestartBackoff = 5 * time.Second // least time between two restarts; doubles while they do not help
	guardMaxBackoff     = 5 * time.Minute
	guardSettled        = time.Minute // a store fine this long resets the backoff
	guardProbeBytes     = 64 << 10    // the test write while all is well: finds a full disk
	guardRecoverBytes   = 4 << 20     // the test write before a restart: room for one to work
)

// StoreGuard watches the JetStream store of a Node, and brings it back by itself after
// the store's file system was full.
//
// nats-server treats a failed write as fatal until it restarts: a stream that could not
// write keeps answering with that error (a single server), or the server shuts
// JetStream down (a cluster node). Freeing space changes neither. The guard sees both
// (the server's own health check, and a small test write of its own to the store's file
// system every 2 s, which also finds a full disk before JetStream tries to write), and
// once a test write of 4 MiB succeeds, it restarts the server in place: the streams are
// read back from disk, and a cluster node rejoins its peers. Nothing acknowledged is
// lost: only writes that failed were not stored, and those were never acknowledged.
type StoreGuard struct {
	// OnFatal, if set, hears that the server could not be started again after a few
	// tries, so the node has none running: a supervisor should restart the process.
	OnFatal func(error)

	node     *Node
	probe    string // the test file
	log      zerolog.Logger
	restarts atomic.Int64
	broken   atomic.Bool // err != nil, read without the lock

	mu           sync.Mutex
	err          error     // why the store cannot write, nil when it can
	since        time.Time // when err began
	lastRestart  time.Time
	backoff      time.Duration // least time until the next restart
	healthySince time.Time     // when the store last became fine
	healthyFor   time.Duration // how long it had been fine when it broke this time
	lastProbe    time.Time
	lastBig      time.Time // the last 4 MiB test write
	// clients, if set, says what the server's clients have seen: a storage error in
	// answer to their writes. A single server keeps a failed write's error in the
	// stream's file store, and when a removal failed first the server's health check
	// does not show it (it shows a failed publish): the queue's clients do.
	clients func() error
}

func newGuard(n *Node, storeDir string, log zerolog.Logger) *StoreGuard {
	return &StoreGuard{node: n, probe: filepath.Join(storeDir, ".store-probe"),
		log: log.With().Str("component", "store-guard").Logger()}
}

// Err says why the store cannot take writes now; nil when it can.
func (g *StoreGuard) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Broken says whether Err is not nil, without taking a lock.
func (g *StoreGuard) Broken() bool { return g.broken.Load() }

// HearClients makes the guard ask clients, at each check, for a storage error the
// server's clients met in answer to their writes (queue.Queue.UseGuard).
func (g *StoreGuard) HearClients(clients func() error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.clients = clients
}

// Restarts is how many times the guard restarted the server.
func (g *StoreGuard) Restarts() int64 { return g.restarts.Load() }

// Run checks the store every interval (DefaultGuardEvery if zero) until ctx ends.
func (g *StoreGuard) Run(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = DefaultGuardEvery
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		g.Check()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Check looks at the store once, restarts the server when its JetStream failed and the
// file system takes writes again, and logs when the store's state changes.
func (g *StoreGuard) Check() {
	broken := g.jetStreamFault()
	g.mu.Lock()
	failing := g.err != nil
	probeDue := failing || broken != nil || time.Since(g.lastProbe) >= guardProbeEvery
	g.mu.Unlock()

	var diskErr error
	if probeDue {
		size := guardProbeBytes
		if broken != nil {
			// A restart needs room to work in: a store that failed on a full disk frees a
			// little as it shuts down, not enough to start again. The big write only
			// every 2 s, not to take what is left from anything still writing.
			g.mu.Lock()
			big := time.Since(g.lastBig) >= guardProbeEvery
			if big {
				g.lastBig = time.Now()
			}
			g.mu.Unlock()
			if !big {
				g.setState(broken, false)
				return
			}
			size = guardRecoverBytes
		}
		diskErr = g.tryWrite(size)
	}
	if broken != nil && diskErr == nil && g.restartDue() {
		g.restart(broken)
		broken = g.jetStreamFault()
	}
	cause := broken
	if diskErr != nil {
		cause = diskErr
	}
	g.setState(cause, probeDue)
}

// jetStreamFault asks the server whether JetStream is shut down or a stream has a write
// error.
func (g *StoreGuard) jetStreamFault() error {
	s := g.node.Server()
	if !s.JetStreamEnabled() {
		return errors.New("JetStream is shut down on this server (it does so when its store cannot write)")
	}
	h := s.Healthz(&server.HealthzOptions{Details: true})
	for _, e := range h.Errors {
		if strings.Contains(e.Error, "write error") {
			return errors.New(e.Error)
		}
	}
	g.mu.Lock()
	clients := g.clients
	g.mu.Unlock()
	if clients != nil {
		return clients()
	}
	return nil
}

// tryWrite writes, syncs and removes a file of size bytes beside the store.
func (g *StoreGuard) tryWrite(size int) error {
	g.mu.Lock()
	g.lastProbe = time.Now()
	g.mu.Unlock()
	f, err := os.OpenFile(g.probe, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("store file system: %w", err)
	}
	_, err = f.Write(make([]byte, size))
	if err == nil {
		err = f.Sync()
	}
	err = errors.Join(err, f.Close())
	_ = os.Remove(g.probe)
	if err != nil {
		return fmt.Errorf("store file system: %w", err)
	}
	return nil
}

func (g *StoreGuard) restartDue() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return time.Since(g.lastRestart) >= g.backoff
}

// backoffAfter is the least time from a restart to the next one: the least there is when
// the store had stayed fine for guardSettled before it broke this time; else doubled (the
// last restart did not help for long: whatever breaks the store is not a full disk alone,
// so restart less and less often rather than in a loop).
func backoffAfter(prev, healthyFor time.Duration) time.Duration {
	if healthyFor >= guardSettled {
		return guardRestartBackoff
	}
	return min(max(prev*2, guardRestartBackoff), guardMaxBackoff)
}

// noteRestart sets when the next restart may come, for one that starts now.
func (g *StoreGuard) noteRestart() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.backoff = backoffAfter(g.backoff, g.healthyFor)
	g.healthyFor = 0 // another restart in this episode: the last one did not help
	g.lastRestart = time.Now()
}

// restart starts the server anew, on the same options and files. A start that fails is
// tried again at once a few times; then OnFatal hears of it.
func (g *StoreGuard) restart(cause error) {
	g.noteRestart()
	g.log.Warn().Err(cause).Msg("the store's file system takes writes again; restarting the NATS server in place to clear its write error")
	var err error
	for try := range 3 {
		if err = g.node.Restart(); err == nil {
			g.restarts.Add(1)
			return
		}
		g.log.Error().Err(err).Int("try", try+1).Msg("starting the NATS server again failed")
		time.Sleep(time.Second)
	}
	if g.OnFatal != nil {
		g.OnFatal(fmt.Errorf("the NATS server could not be started again: %w", err))
	}
}

// setState records the store's state and logs a change: once when it stops taking
// writes (with the cause), once when it takes them again.
func (g *StoreGuard) setState(cause error, probed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case cause != nil && g.err == nil:
		if !g.healthySince.IsZero() {
			g.healthyFor = time.Since(g.healthySince)
		}
		if g.healthyFor >= guardSettled {
			// The last recovery held: this is a new episode (a disk full again), not a
			// restart that did not help. Its first restart need not wait out a backoff
			// grown by earlier episodes (seen: 2.5 minutes in a soak, after eight).
			g.backoff = guardRestartBackoff
		}
		g.err, g.since, g.healthySince = cause, time.Now(), time.Time{}
		g.broken.Store(true)
		g.log.Error().Err(cause).Msg("the JetStream store cannot take writes; not ready until it can (the server is restarted by itself once the file system takes writes again)")
	case cause != nil:
		g.err = cause
	case g.err != nil && probed:
		g.log.Info().Dur("after", time.Since(g.since)).Int64("restarts", g.restarts.Load()).Msg("the JetStream store takes writes again")
		g.err, g.healthySince = nil, time.Now()
		g.broken.Store(false)
	}
}

// Collector counts the guard's restarts of JetStream, for Prometheus.
func (g *StoreGuard) Collector() prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "dispatch_nats_restarts_total",
		Help: "Times the embedded NATS server was restarted in place by the store guard, after its store could not write (a full disk) and took writes again.",
	}, func() float64 { return float64(g.restarts.Load()) })
}
