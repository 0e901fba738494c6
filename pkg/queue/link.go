package queue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ErrLinkUnproven is Head's error while no write has gone through the NATS server the
// connection is on since it moved there: a head read there may be stale.
var ErrLinkUnproven = errors.New("no write to the request stream has gone through this NATS server since the connection moved to it; a server cut off from its cluster answers reads from an old copy, so the head is not read there")

// linkProof keeps head reads off a NATS server cut off from its cluster.
//
// A server that led the request stream goes on answering reads as its leader for up to
// 10 s after it lost its quorum (nats-server's lost-quorum interval), from its copy of
// the stream, which misses every removal made on the other side since. A dispatcher
// whose connection moved to it (a reconnect, or WatchWrites moving away from a server
// through which JetStream does not answer) would read a delivered request as the head
// and send it again. A write needs the quorum: once one has gone through the server the
// connection is on, its reads come from a stream leader that had the quorum then.
//
// The connection's reconnect count names the server it is on; proven holds the count at
// the last write that went through (-1: none). The dispatcher turns the proof on
// (ProveHeadReads) and runs WatchWrites, whose test writes prove a link; Head waits for
// one after a move. Ingest does not: it reads no head (NoBodyReads), and its test writes go
// to the health stream (HealthRole), whose leader says nothing of the request stream's.
type linkProof struct {
	on     atomic.Bool
	proven atomic.Int64
	kick   chan struct{} // asks WatchWrites for a test write now

	mu     sync.Mutex
	landed chan struct{} // closed at the next proof
}

func newLinkProof() *linkProof {
	p := &linkProof{kick: make(chan struct{}, 1), landed: make(chan struct{})}
	p.proven.Store(-1)
	return p
}

// ProveHeadReads makes Head read only through a NATS server a write has gone through
// since the connection moved to it. WatchWrites must run: its test writes are the proof.
func (q *Queue) ProveHeadReads() { q.proof.on.Store(true) }

// LinkCollector is a gauge for Prometheus: 1 while head reads are proven
// (ProveHeadReads) and the server the connection is on is proven, else 0.
func (q *Queue) LinkCollector() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "dispatch_queue_link_proven",
		Help: "1 while a write has gone through the NATS server this dispatcher is connected to since it moved there, so its head reads are trusted, else 0: then no head is read and nothing is sent. 0 for a second or two after a move is normal; for longer, the server is likely cut off from its cluster.",
	}, func() float64 {
		if q.proof.on.Load() && q.proof.proven.Load() == q.link() {
			return 1
		}
		return 0
	})
}

// link is the connection's reconnect count: it changes whenever the server does.
func (q *Queue) link() int64 { return int64(q.nc.Stats().Reconnects) }

// writeLanded records that a write sent while the connection was on link was answered
// by the stream after its replication (every change to a stream is: nats-server answers
// a removal, even of a missing message, once its quorum has applied it).
func (q *Queue) writeLanded(link int64) {
	p := q.proof
	if p.proven.Load() == link || q.link() != link { // the first is the steady state: no lock
		return
	}
	p.proven.Store(link)
	p.mu.Lock()
	close(p.landed)
	p.landed = make(chan struct{})
	p.mu.Unlock()
}

// writeUnanswered records that a test write through link got no answer: the server
// may be cut off, so its reads are not trusted until a write goes through again.
func (q *Queue) writeUnanswered(link int64) { q.proof.proven.CompareAndSwap(link, -1) }

// provenLink returns the link a head may be read through, waiting up to probeTimeout
// for a test write to prove it; ErrLinkUnproven when none does.
func (q *Queue) provenLink(ctx context.Context) (int64, error) {
	p := q.proof
	if !p.on.Load() {
		return 0, nil
	}
	link := q.link()
	if p.proven.Load() == link {
		return link, nil
	}
	p.mu.Lock()
	landed := p.landed
	p.mu.Unlock()
	if p.proven.Load() == link { // proven since the look above: landed is the next one's
		return link, nil
	}
	select {
	case p.kick <- struct{}{}:
	default:
	}
	timer := time.NewTimer(probeTimeout)
	defer timer.Stop()
	select {
	case <-landed:
	case <-timer.C:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	if link = q.link(); p.proven.Load() == link {
		return link, nil
	}
	return 0, fmt.Errorf("%w (server %s)", ErrLinkUnproven, q.nc.ConnectedUrlRedacted())
}

// stillProven says whether a read made after provenLink returned link came through it.
func (q *Queue) stillProven(link int64) error {
	p := q.proof
	if !p.on.Load() || (q.link() == link && p.proven.Load() == link) {
		return nil
	}
	return fmt.Errorf("%w (the connection moved during the read)", ErrLinkUnproven)
}
