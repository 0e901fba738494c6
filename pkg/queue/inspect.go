package queue

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// ClientLane finds where clientID's requests are queued: its lane and how many are
// queued there. ok is false when it has none.
func (q *Queue) ClientLane(ctx context.Context, clientID string) (lane request.Lane, count uint64, ok bool, err error) {
	if err := request.ValidateClientID(clientID); err != nil {
		return request.Lane{}, 0, false, err
	}
	m, err := q.backlog(ctx, request.RequestPrefix+"*."+request.EncodeClientID(clientID))
	if err != nil {
		return request.Lane{}, 0, false, err
	}
	for s, n := range m {
		lane, err := request.LaneOf(s)
		return lane, n, err == nil, err
	}
	return request.Lane{}, 0, false, nil
}

// LastSeq is the sequence of the newest request queued on subject; 0 when none is.
func (q *Queue) LastSeq(ctx context.Context, subject string) (uint64, error) {
	m, err := q.reqs.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading last request of %s: %w", subject, err)
	}
	return m.Sequence, nil
}

// QueuedAfter counts the requests queued on subject after sequence seq, asking the
// server through a consumer that starts there (no message is read).
func (q *Queue) QueuedAfter(ctx context.Context, subject string, seq uint64) (uint64, error) {
	cons, err := q.reqs.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubject:     subject,
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       seq + 1,
		AckPolicy:         jetstream.AckNonePolicy,
		MemoryStorage:     true,
		Replicas:          1,
		InactiveThreshold: 5 * time.Second,
	})
	if err != nil {
		return 0, fmt.Errorf("counting %s after %d: %w", subject, seq, err)
	}
	n := cons.CachedInfo().NumPending
	_ = q.reqs.DeleteConsumer(ctx, cons.CachedInfo().Name) // else the server drops it when inactive
	return n, nil
}

// Found is a queued request found by id.
type Found struct {
	request.Stored       // without the body
	Position       int64 // requests ahead of it in its client's queue; -1 when not counted
}

// FindRequest looks for the queued request with this id, reading headers only: on
// clientID's subject when it is given, else across the whole queue (slow on a large
// backlog). ok is false when it is not queued.
func (q *Queue) FindRequest(ctx context.Context, id, clientID string) (f Found, ok bool, err error) {
	filter := "" // the whole stream
	if clientID != "" {
		if err := request.ValidateClientID(clientID); err != nil {
			return Found{}, false, err
		}
		filter = request.RequestPrefix + "*." + request.EncodeClientID(clientID)
	}
	errFound := errors.New("found")
	var ahead int64
	err = q.scan(ctx, q.reqs, filter, true, func(m jetstream.Msg, md *jetstream.MsgMetadata) error {
		if m.Headers().Get(request.HeaderID) != id {
			ahead++
			return nil
		}
		f = Found{Stored: storedOf(m.Subject(), m.Headers(), nil, md.Sequence.Stream, md.Timestamp), Position: -1}
		if clientID != "" {
			f.Position = ahead
		}
		return errFound
	})
	if errors.Is(err, errFound) {
		return f, true, nil
	}
	return Found{}, false, err
}

// Queued lists up to limit of clientID's queued requests, in the order they will go,
// reading headers only (no bodies).
func (q *Queue) Queued(ctx context.Context, clientID string, limit int) ([]request.Stored, error) {
	if err := request.ValidateClientID(clientID); err != nil {
		return nil, err
	}
	errEnough := errors.New("enough")
	var out []request.Stored
	if limit <= 0 {
		return out, nil
	}
	err := q.scan(ctx, q.reqs, request.RequestPrefix+"*."+request.EncodeClientID(clientID), true, func(m jetstream.Msg, md *jetstream.MsgMetadata) error {
		out = append(out, storedOf(m.Subject(), m.Headers(), nil, md.Sequence.Stream, md.Timestamp))
		if len(out) == limit {
			return errEnough
		}
		return nil
	})
	if errors.Is(err, errEnough) {
		err = nil
	}
	return out, err
}

// OldestHeads finds the k clients whose head requests are the oldest, oldest first, by
// reading the queue in order (headers only): a subject's first message read is its head,
// and the stream orders messages as they were accepted. It reads at most maxRead
// messages; complete is false when that was not enough to find k (or every) client.
func (q *Queue) OldestHeads(ctx context.Context, k, maxRead int) (heads []request.Stored, complete bool, err error) {
	errDone := errors.New("done")
	seen := map[string]bool{}
	read := 0
	err = q.scan(ctx, q.reqs, "", true, func(m jetstream.Msg, md *jetstream.MsgMetadata) error {
		read++
		if !strings.HasPrefix(m.Subject(), request.RequestPrefix) {
			return nil // a final event kept in the stream (ADR 9) is no client's head
		}
		if !seen[m.Subject()] {
			seen[m.Subject()] = true
			heads = append(heads, storedOf(m.Subject(), m.Headers(), nil, md.Sequence.Stream, md.Timestamp))
			if len(heads) == k {
				return errDone
			}
		}
		if read >= maxRead {
			return errRead
		}
		return nil
	})
	switch {
	case errors.Is(err, errDone):
		return heads, true, nil
	case errors.Is(err, errRead):
		return heads, false, nil
	case err != nil:
		return nil, false, err
	}
	return heads, true, nil // the whole queue read: every client's head
}

var errRead = errors.New("read enough")

// StoredSubject is the subject the request stream stores clientID's requests under: the
// partition is the server's {{partition(N,1)}} of the client's token, an FNV-1a hash
// modulo the partitions (TestStoredSubjectIsTheServers holds it to the server's).
func (q *Queue) StoredSubject(clientID string) string {
	token := request.EncodeClientID(clientID)
	h := fnv.New32a()
	_, _ = h.Write([]byte(token))
	return request.RequestPrefix + strconv.Itoa(int(h.Sum32()%uint32(q.cfg.Partitions))) + "." + token
}

// Stats is the queue as a whole, cheap to read.
type Stats struct {
	Requests     uint64    // requests queued
	Clients      uint64    // clients with requests queued
	Oldest       time.Time // when the oldest queued request was accepted; zero when none
	DeadLetters  uint64    // requests in the dead-letter stream
	RequestBytes uint64    // bytes the request stream holds
}

// Stats reads both streams' state. Final events kept in the request stream (ADR 9) are
// not counted as requests, nor their subjects as clients.
func (q *Queue) Stats(ctx context.Context) (Stats, error) {
	ri, err := q.reqs.Info(ctx, jetstream.WithSubjectFilter(request.OutcomePrefix+">"))
	if err != nil {
		return Stats{}, fmt.Errorf("stream %s: %w", RequestStream, err)
	}
	di, err := q.dead.Info(ctx)
	if err != nil {
		return Stats{}, fmt.Errorf("stream %s: %w", DeadLetterStream, err)
	}
	st := Stats{Requests: ri.State.Msgs, Clients: ri.State.NumSubjects, DeadLetters: di.State.Msgs, RequestBytes: ri.State.Bytes}
	for _, n := range ri.State.Subjects {
		st.Requests, st.Clients = st.Requests-min(n, st.Requests), st.Clients-min(1, st.Clients)
	}
	if st.Requests > 0 {
		st.Oldest = ri.State.FirstTime
	}
	return st, nil
}

// Placement is where the request stream lives on a cluster now.
type Placement struct {
	Leader  string // the server leading it; empty while it has none
	Current int    // servers holding a current copy: the leader and its caught-up, online followers
}

// RequestPlacement reads where the request stream lives now. On a single server the
// leader is that server and Current is 1.
func (q *Queue) RequestPlacement(ctx context.Context) (Placement, error) {
	info, err := q.reqs.Info(ctx)
	if err != nil {
		return Placement{}, fmt.Errorf("stream %s: %w", RequestStream, err)
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return Placement{}, nil
	}
	p := Placement{Leader: info.Cluster.Leader, Current: 1}
	for _, r := range info.Cluster.Replicas {
		if r.Current && !r.Offline {
			p.Current++
		}
	}
	return p, nil
}
