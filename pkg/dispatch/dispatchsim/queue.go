package dispatchsim

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Queue is a simulated request stream with what pkg/queue's Queue does for the
// dispatcher: each client's requests in its own lane in a partition, oldest first; a
// direct read of a lane's head; deletes by sequence (one already gone is no error); a
// listing of a partition's lanes; a watch of the lanes new requests go to; and a
// dead-letter stream. Instances reach it through a View, which adds their faults.
type Queue struct {
	mu         sync.Mutex
	partitions int
	seq        uint64
	msgs       []request.Stored // by sequence
	added      []request.Stored // every request ever queued
	dead       []DeadLetter
	watchers   map[*fifo[request.Lane]]map[int]bool // the partitions each watches
}

// DeadLetter is a request written to the dead-letter stream, and why.
type DeadLetter struct {
	request.Stored
	Why request.Verdict
	At  time.Time
}

// NewQueue returns an empty queue over the given number of partitions.
func NewQueue(partitions int) *Queue {
	return &Queue{partitions: partitions, watchers: map[*fifo[request.Lane]]map[int]bool{}}
}

// Lane is where client's requests go: a partition of its own by a hash of its id, as
// the stream's subject transform does it.
func (q *Queue) Lane(client string) request.Lane {
	return request.LaneOfClient(int(fnv32(client)%uint32(q.partitions)), client)
}

// Add queues a request for client and returns it as stored.
func (q *Queue) Add(client, id string, body []byte) request.Stored {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.seq++
	st := request.Stored{Request: request.Request{ID: id, ClientID: client, Body: body, ContentType: "application/json"},
		Seq: q.seq, Subject: q.Lane(client).Subject(), Lane: q.Lane(client), AcceptedAt: time.Now()}
	q.msgs = append(q.msgs, st)
	q.added = append(q.added, st)
	for w, watched := range q.watchers {
		if watched[st.Lane.Partition] {
			w.push(st.Lane)
		}
	}
	return st
}

// Queued is what the queue holds, oldest first.
func (q *Queue) Queued() []request.Stored {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.msgs)
}

// Added is every request ever queued, in order.
func (q *Queue) Added() []request.Stored {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.added)
}

// DeadLetters is what the dead-letter stream holds.
func (q *Queue) DeadLetters() []DeadLetter {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.dead)
}

func (q *Queue) backlog(p int) map[request.Lane]uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := map[request.Lane]uint64{}
	for _, st := range q.msgs {
		if st.Lane.Partition == p {
			out[st.Lane]++
		}
	}
	return out
}

func (q *Queue) head(lane request.Lane) (request.Stored, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, st := range q.msgs {
		if st.Lane == lane {
			return st, true
		}
	}
	return request.Stored{}, false
}

// find is request id in lane, if it is queued there.
func (q *Queue) find(lane request.Lane, id string) (request.Stored, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, st := range q.msgs {
		if st.Lane == lane && st.ID == id {
			st.Body = nil // headers only, as the real queue reads it
			return st, true
		}
	}
	return request.Stored{}, false
}

// delete removes seq and returns it, if it was there; lane must be the one it is queued
// in (the real queue does not check: a dispatcher that names another is wrong).
func (q *Queue) delete(lane request.Lane, seq uint64) (request.Stored, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	i := slices.IndexFunc(q.msgs, func(st request.Stored) bool { return st.Seq == seq }) // as the queue deletes
	if i < 0 {
		return request.Stored{}, false
	}
	st := q.msgs[i]
	if st.Lane != lane {
		panic(fmt.Sprintf("delete of request %d named lane %s; it is queued in %s", seq, lane, st.Lane))
	}
	q.msgs = slices.Delete(q.msgs, i, i+1)
	return st, true
}

func (q *Queue) addDead(st request.Stored, why request.Verdict) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.dead = append(q.dead, DeadLetter{Stored: st, Why: why, At: time.Now()})
}

// QueueView is one instance's way to the queue: a dispatch.Source with its faults.
type QueueView struct {
	q  *Queue
	in *Instance
}

// Partitions implements dispatch.Source.
func (v *QueueView) Partitions() int { return v.q.partitions }

// PartitionBacklog implements dispatch.Source.
func (v *QueueView) PartitionBacklog(ctx context.Context, p int) (map[request.Lane]uint64, error) {
	var out map[request.Lane]uint64
	if err := v.in.call(ctx, portQueue, "list", p, func() { out = v.q.backlog(p) }); err != nil {
		return nil, err // a call given up on may still land, and write out: not read then
	}
	return out, nil
}

// Watch implements dispatch.Source: the lane of each request added from now on in one
// of partitions. It starts as a call to the queue (which the faults can fail or slow),
// and hands each lane over after a drawn delay, as a consumer's delivery comes late: a
// watch stopped meanwhile never hands over what it still held.
func (v *QueueView) Watch(ctx context.Context, partitions []int, fn func(request.Lane), onErr func(error)) (func(), error) {
	watched := map[int]bool{}
	for _, p := range partitions {
		if p >= 0 && p < v.q.partitions {
			watched[p] = true
		}
	}
	if len(watched) == 0 {
		return nil, fmt.Errorf("watch of no partition of %d in %v", v.q.partitions, partitions)
	}
	w := newFIFO[request.Lane]()
	stopped := false
	stop := func() {
		w.stop()
		v.q.mu.Lock()
		stopped = true
		delete(v.q.watchers, w)
		v.q.mu.Unlock()
	}
	err := v.in.call(ctx, portQueue, "watch", len(watched), func() {
		v.q.mu.Lock()
		defer v.q.mu.Unlock()
		if !stopped { // the call was given up on before it landed
			v.q.watchers[w] = watched
		}
	})
	if err != nil {
		stop()
		return nil, err
	}
	context.AfterFunc(ctx, stop)
	go func() {
		for n := 0; ; n++ {
			s, ok := w.next()
			if !ok || !sleepCtx(v.in.w.ctx, v.in.w.draw(v.in, portQueue, "watched", n).latency) || w.done() {
				return
			}
			fn(s)
		}
	}()
	return stop, nil
}

// Head implements dispatch.Source.
func (v *QueueView) Head(ctx context.Context, lane request.Lane) (request.Stored, bool, error) {
	var st request.Stored
	var ok bool
	if err := v.in.call(ctx, portQueue, "head", int(fnv32(lane.Subject())), func() { st, ok = v.q.head(lane) }); err != nil {
		return request.Stored{}, false, err
	}
	return st, ok, nil
}

// Find implements dispatch.Source.
func (v *QueueView) Find(ctx context.Context, lane request.Lane, id string) (request.Stored, bool, error) {
	var st request.Stored
	var ok bool
	if err := v.in.call(ctx, portQueue, "find", int(fnv32(lane.Subject())), func() { st, ok = v.q.find(lane, id) }); err != nil {
		return request.Stored{}, false, err
	}
	return st, ok, nil
}

// Delete implements dispatch.Source.
func (v *QueueView) Delete(ctx context.Context, lane request.Lane, seq uint64) error {
	called := time.Now()
	gone := false
	err := v.in.call(ctx, portQueue, "delete", int(seq), func() {
		st, ok := v.q.delete(lane, seq)
		if ok {
			v.in.w.removedFinal(v.in, st)
		}
		gone = !ok
		v.in.w.deleted(v.in, seq, called, time.Now(), false)
	})
	if err != nil {
		v.in.w.deleted(v.in, seq, called, time.Time{}, true)
		return err
	}
	if gone {
		return fmt.Errorf("deleting request %d: %w", seq, request.ErrNotQueued)
	}
	return nil
}

// KeepOutcome implements dispatch.Source: the final event is kept in the queue's store,
// with the faults of the queue.
func (v *QueueView) KeepOutcome(ctx context.Context, e request.Event) error {
	called := time.Now()
	err := v.in.call(ctx, portQueue, "keep", int(e.Seq), func() {
		v.in.w.finalStored(e)
		v.in.w.kept(v.in, e.Seq, called, time.Now(), false)
	})
	if err != nil {
		v.in.w.kept(v.in, e.Seq, called, time.Time{}, true)
	}
	return err
}

// AddDeadLetter implements dispatch.Source.
func (v *QueueView) AddDeadLetter(ctx context.Context, st request.Stored, why request.Verdict) error {
	return v.in.call(ctx, portQueue, "dead-letter", int(st.Seq), func() { v.q.addDead(st, why) })
}

// errRefused is what a call the faults refuse answers.
var errRefused = errors.New("simulated fault: the call failed")

func mapsKeys[K comparable, V any](m map[K]V) iter.Seq[K] { return maps.Keys(m) }

func fnv32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}
