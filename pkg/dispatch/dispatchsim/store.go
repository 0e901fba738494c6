package dispatchsim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Store is a simulated lease store, shared by every instance, with what the NATS KV
// bucket behind pkg/queue's Leases does: one revision counter for every change, a TTL on
// every key from its last write, expiry by the store's own clock with no trace (no watch
// event), compare-and-swap on the revision, deletes (releases) that watchers see with no
// owner named, and watches that give the keys in place first. Instances reach it through
// a View, which adds the faults drawn for them.
type Store struct {
	mu       sync.Mutex
	ttl      time.Duration
	skew     time.Duration // the store's clock runs ahead of the simulation's by this
	rev      uint64
	leases   map[int]*key
	members  map[string]*key
	watchers map[*fifo[Change]]struct{}
	note     func(format string, args ...any) // for a failure's report
}

type key struct {
	owner   string
	rev     uint64
	expires time.Time // by the store's clock
}

// Change is one change a watch delivers: a lease or a heartbeat.
type Change = request.LeaseChange

// NewStore returns an empty store whose keys live for ttl.
func NewStore(ttl time.Duration) *Store {
	return &Store{ttl: ttl, leases: map[int]*key{}, members: map[string]*key{}, watchers: map[*fifo[Change]]struct{}{}}
}

func (s *Store) now() time.Time { return time.Now().Add(s.skew) }

// Jump moves the store's clock forward by d: keys it would expire within d expire now,
// without a trace, while their holders still count them as theirs.
func (s *Store) Jump(d time.Duration) {
	s.mu.Lock()
	s.skew += d
	s.mu.Unlock()
}

// expire removes what has expired by the store's clock. The lock is held.
func (s *Store) expire() {
	now := s.now()
	for p, k := range s.leases {
		if !now.Before(k.expires) {
			delete(s.leases, p)
		}
	}
	for id, k := range s.members {
		if !now.Before(k.expires) {
			delete(s.members, id)
		}
	}
}

// put records a change and hands it to the watchers. The lock is held.
func (s *Store) put(c Change) {
	for w := range s.watchers {
		w.push(c)
	}
}

// ErrWrongRevision is a compare-and-swap that found another revision (or no key).
var ErrWrongRevision = errors.New("wrong last revision")

func (s *Store) heartbeat(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire()
	s.rev++
	s.members[id] = &key{owner: id, rev: s.rev, expires: s.now().Add(s.ttl)}
	s.put(Change{Heartbeat: true, Owner: id, Rev: s.rev})
}

func (s *Store) leave(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire()
	s.rev++
	delete(s.members, id)
	s.put(Change{Heartbeat: true, Released: true, Rev: s.rev})
}

func (s *Store) memberIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire()
	var ids []string
	for id := range s.members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (s *Store) acquire(p int, owner string) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire()
	if s.leases[p] != nil {
		return 0, false
	}
	s.rev++
	s.leases[p] = &key{owner: owner, rev: s.rev, expires: s.now().Add(s.ttl)}
	s.put(Change{Partition: p, Owner: owner, Rev: s.rev})
	return s.rev, true
}

func (s *Store) renew(p int, owner string, rev uint64) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire()
	k := s.leases[p]
	if k == nil || k.rev != rev {
		if s.note != nil {
			s.note("store: renewal of p%d by %s at rev %d refused: %s", p, owner, rev, k)
		}
		return 0, false
	}
	s.rev++
	k.owner, k.rev, k.expires = owner, s.rev, s.now().Add(s.ttl)
	s.put(Change{Partition: p, Owner: owner, Rev: s.rev})
	return s.rev, true
}

func (s *Store) release(p int, rev uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire()
	k := s.leases[p]
	if k == nil || k.rev != rev {
		return fmt.Errorf("releasing partition %d: %w", p, ErrWrongRevision)
	}
	s.rev++
	delete(s.leases, p)
	s.put(Change{Partition: p, Released: true, Rev: s.rev})
	return nil
}

func (s *Store) releaseAll(owner string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire()
	n := 0
	for _, p := range slices.Sorted(mapsKeys(s.leases)) {
		if s.leases[p].owner != owner {
			continue
		}
		s.rev++
		delete(s.leases, p)
		s.put(Change{Partition: p, Released: true, Rev: s.rev})
		n++
	}
	return n
}

func (s *Store) written() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rev > 0
}

// Owners is who holds each lease now, by the store's clock.
func (s *Store) Owners() map[int]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire()
	out := map[int]string{}
	for p, k := range s.leases {
		out[p] = k.owner
	}
	return out
}

// watch registers w and gives it the keys in place, oldest revision first.
func (s *Store) watch(w *fifo[Change]) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire()
	var now []Change
	for id, k := range s.members {
		now = append(now, Change{Heartbeat: true, Owner: id, Rev: k.rev})
	}
	for p, k := range s.leases {
		now = append(now, Change{Partition: p, Owner: k.owner, Rev: k.rev})
	}
	slices.SortFunc(now, func(a, b Change) int { return int(a.Rev) - int(b.Rev) })
	for _, c := range now {
		w.push(c)
	}
	s.watchers[w] = struct{}{}
}

func (s *Store) unwatch(w *fifo[Change]) {
	s.mu.Lock()
	delete(s.watchers, w)
	s.mu.Unlock()
}

// StoreView is one instance's way to the store: a lease.Store that adds the faults
// drawn for that instance.
type StoreView struct {
	s  *Store
	in *Instance
}

// natsTimeout is how long a call to the store without a deadline of its own waits for its
// answer: the NATS client's default request timeout.
const natsTimeout = 5 * time.Second

// call makes one call to the store through the instance's faults: the call waits while
// the instance is paused (one under way lands and answers after the resume), fails at once
// while the store refuses the instance, and otherwise lands after the store's latency
// whether or not the caller still waits for the answer (a call that times out may land).
func (v *StoreView) call(ctx context.Context, what string, key int, apply func()) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, natsTimeout)
		defer cancel()
	}
	return v.in.call(ctx, portStore, what, key, apply)
}

// Heartbeat implements lease.Store.
func (v *StoreView) Heartbeat(ctx context.Context, id string) error {
	return v.call(ctx, "heartbeat", -1, func() { v.s.heartbeat(id) })
}

// Leave implements lease.Store.
func (v *StoreView) Leave(ctx context.Context, id string) error {
	return v.call(ctx, "leave", -1, func() { v.s.leave(id) })
}

// Members implements lease.Store. Like the real one, a listing whose end never
// comes ends with the caller's deadline, or the NATS client's timeout without one.
func (v *StoreView) Members(ctx context.Context) ([]string, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, natsTimeout)
		defer cancel()
	}
	var ids []string
	if err := v.in.call(ctx, portList, "members", -1, func() { ids = v.s.memberIDs() }); err != nil {
		return nil, err // a call given up on may still land, and write ids: not read then
	}
	return ids, nil
}

// Written implements lease.Store.
func (v *StoreView) Written(ctx context.Context) (bool, error) {
	var written bool
	if err := v.call(ctx, "status", -1, func() { written = v.s.written() }); err != nil {
		return true, err
	}
	return written, nil
}

// Acquire implements lease.Store.
func (v *StoreView) Acquire(ctx context.Context, p int, owner string) (uint64, bool, error) {
	var rev uint64
	var ok bool
	if err := v.call(ctx, "acquire", p, func() { rev, ok = v.s.acquire(p, owner) }); err != nil {
		return 0, false, err
	}
	return rev, ok, nil
}

// Renew implements lease.Store.
func (v *StoreView) Renew(ctx context.Context, p int, owner string, rev uint64) (uint64, bool, error) {
	var newRev uint64
	var ok bool
	if err := v.call(ctx, "renew", p, func() { newRev, ok = v.s.renew(p, owner, rev) }); err != nil {
		return 0, false, err
	}
	return newRev, ok, nil
}

// Release implements lease.Store.
func (v *StoreView) Release(ctx context.Context, p int, rev uint64) error {
	var rerr error
	if err := v.call(ctx, "release", p, func() { rerr = v.s.release(p, rev) }); err != nil {
		return err
	}
	return rerr
}

// ReleaseAll implements lease.Store.
func (v *StoreView) ReleaseAll(ctx context.Context, owner string) (int, error) {
	var n int
	if err := v.call(ctx, "release all", -1, func() { n = v.s.releaseAll(owner) }); err != nil {
		return 0, err
	}
	return n, nil
}

// WatchLeases implements lease.Store: the keys in place, then every change, each
// delivered after the instance's watch delay; a watch the faults end calls lost.
func (v *StoreView) WatchLeases(ctx context.Context, fn func(request.LeaseChange), lost func(error)) (func(), error) {
	if err := v.call(ctx, "watch", -1, func() {}); err != nil {
		return nil, err
	}
	w := newFIFO[Change]()
	v.s.watch(w)
	var stopped sync.Once
	stop := func() { stopped.Do(func() { w.stop(); v.s.unwatch(w) }) }
	go func() {
		defer stop()
		for {
			c, ok := w.next()
			if !ok {
				return
			}
			delay, twice, end := v.in.w.watchFault(v.in, c)
			if !sleepCtx(ctx, delay) || v.in.awake(ctx) != nil {
				return
			}
			if end {
				if ctx.Err() == nil {
					lost(errors.New("the lease watch's updates ended"))
				}
				return
			}
			fn(c)
			if twice {
				fn(c)
			}
		}
	}()
	return stop, nil
}

func (k *key) String() string {
	if k == nil {
		return "no lease (expired or released)"
	}
	return fmt.Sprintf("held by %s at rev %d", k.owner, k.rev)
}
