package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// LeaseBucket is the KV bucket that holds partition leases and instance heartbeats.
const LeaseBucket = "DISPATCH_LEASES"

const (
	leaseKeyPrefix  = "p."
	memberKeyPrefix = "m."
)

// Leases is the partition-lease store: one key per partition whose value names its owner
// (and since when it holds the partition), and one heartbeat key per dispatcher instance.
// Every key lives for the bucket's TTL unless written again, so a dead instance's leases
// and heartbeat expire by themselves.
type Leases struct {
	kv    jetstream.KeyValue
	mu    sync.Mutex
	since map[held]time.Time // when each owner using this store acquired each partition it holds
}

type held struct {
	p     int
	owner string
}

// lease is a lease key's value (JSON).
type lease struct {
	Owner string    `json:"owner"`
	Since time.Time `json:"since,omitzero"`
}

// leaseOf reads a lease key's value; one this service did not write names no owner.
func leaseOf(v []byte) lease {
	var l lease
	_ = json.Unmarshal(v, &l)
	return l
}

func (l *Leases) value(p int, owner string) []byte {
	l.mu.Lock()
	since, ok := l.since[held{p, owner}]
	if !ok {
		since = time.Now().UTC()
		l.since[held{p, owner}] = since
	}
	l.mu.Unlock()
	b, _ := json.Marshal(lease{Owner: owner, Since: since})
	return b
}

func (l *Leases) forget(p int, owner string) {
	l.mu.Lock()
	delete(l.since, held{p, owner})
	l.mu.Unlock()
}

// Leases opens the lease bucket, creating it with the given TTL, replicated like the
// streams. An existing bucket must have the same TTL: every instance fences its sends by
// the TTL, so instances that disagreed on it could both send in one partition.
func (q *Queue) Leases(ctx context.Context, ttl time.Duration) (*Leases, error) {
	kv, err := q.bucket(ctx, jetstream.KeyValueConfig{
		Bucket:      LeaseBucket,
		Description: "Dispatcher partition leases and instance heartbeats.",
		TTL:         ttl,
		History:     1,
	})
	if err != nil {
		return nil, err
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("lease bucket: %w", err)
	}
	if st.TTL() != ttl {
		return nil, fmt.Errorf("LEASE_TTL is %s but the lease bucket %s has %s: every dispatcher must use the bucket's TTL (to change it, stop all dispatchers and delete the bucket)",
			ttl, LeaseBucket, st.TTL())
	}
	return &Leases{kv: kv, since: map[held]time.Time{}}, nil
}

func leaseKey(p int) string { return leaseKeyPrefix + strconv.Itoa(p) }

// Heartbeat says instance id is alive, for another TTL.
func (l *Leases) Heartbeat(ctx context.Context, id string) error {
	if _, err := l.kv.Put(ctx, memberKeyPrefix+id, []byte(time.Now().UTC().Format(time.RFC3339))); err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	return nil
}

// Leave removes instance id's heartbeat at once, on a graceful stop.
func (l *Leases) Leave(ctx context.Context, id string) error {
	if err := l.kv.Delete(ctx, memberKeyPrefix+id); err != nil {
		return fmt.Errorf("leaving: %w", err)
	}
	return nil
}

// Members lists the instances whose heartbeat has not expired.
func (l *Leases) Members(ctx context.Context) ([]string, error) {
	keys, err := l.listKeys(ctx, memberKeyPrefix+">")
	if err != nil {
		return nil, fmt.Errorf("listing members: %w", err)
	}
	ids := make([]string, 0, len(keys))
	for _, k := range keys {
		ids = append(ids, strings.TrimPrefix(k, memberKeyPrefix))
	}
	return ids, nil
}

// listTimeout bounds a key listing whose caller set no deadline: the NATS client's own
// request timeout.
const listTimeout = 5 * time.Second

// listKeys lists the keys matching filter. nats.go ends a listing when its context ends
// as it does when the listing is complete, and without a deadline waits for the end of
// the keys for ever: so there is always one, and a listing cut short is an error, not a
// shorter list.
func (l *Leases) listKeys(ctx context.Context, filter string) ([]string, error) {
	return listKeys(ctx, l.kv, filter)
}

func listKeys(ctx context.Context, kv jetstream.KeyValue, filter string) ([]string, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, listTimeout)
		defer cancel()
	}
	lister, err := kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		return nil, err
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("the listing did not end: %w", err)
	}
	return keys, nil
}

// getAll reads keys together, one round trip to the bucket's leader for all of them
// rather than one each (64 in a row outlasted a loaded cluster's deadlines): those read,
// in order, without the ones gone meanwhile, and why any others were not.
func getAll(ctx context.Context, kv jetstream.KeyValue, keys []string) ([]jetstream.KeyValueEntry, error) {
	entries := make([]jetstream.KeyValueEntry, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() {
			e, err := kv.Get(ctx, k)
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				return
			}
			if err != nil {
				errs[i] = fmt.Errorf("reading %s: %w", k, err)
				return
			}
			entries[i] = e
		})
	}
	wg.Wait()
	var out []jetstream.KeyValueEntry
	for _, e := range entries {
		if e != nil {
			out = append(out, e)
		}
	}
	return out, errors.Join(errs...)
}

// Acquire takes partition p for owner if nobody holds it. ok is false when another
// instance holds it.
func (l *Leases) Acquire(ctx context.Context, p int, owner string) (rev uint64, ok bool, err error) {
	l.forget(p, owner) // a new holding: since now
	rev, err = l.kv.Create(ctx, leaseKey(p), l.value(p, owner))
	switch {
	case err == nil:
		return rev, true, nil
	case errors.Is(err, jetstream.ErrKeyExists):
		l.forget(p, owner)
		return 0, false, nil
	}
	return 0, false, fmt.Errorf("acquiring partition %d: %w", p, err)
}

// Renew extends owner's lease on p, by compare-and-swap on the revision it holds. ok is
// false when the lease is no longer owner's (it expired, or another instance took it).
func (l *Leases) Renew(ctx context.Context, p int, owner string, rev uint64) (newRev uint64, ok bool, err error) {
	newRev, err = l.kv.Update(ctx, leaseKey(p), l.value(p, owner), rev)
	if err == nil {
		return newRev, true, nil
	}
	var apiErr *jetstream.APIError
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) ||
		(errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)) {
		l.forget(p, owner)
		return 0, false, nil
	}
	return 0, false, fmt.Errorf("renewing partition %d: %w", p, err)
}

// Release gives up p, if rev is still the current revision.
func (l *Leases) Release(ctx context.Context, p int, rev uint64) error {
	l.mu.Lock()
	for h := range l.since {
		if h.p == p {
			delete(l.since, h) // whoever held it holds it no longer
		}
	}
	l.mu.Unlock()
	err := l.kv.Delete(ctx, leaseKey(p), jetstream.LastRevision(rev))
	if err != nil {
		return fmt.Errorf("releasing partition %d: %w", p, err)
	}
	return nil
}

// ReleaseAll gives up every lease that names owner, whatever revision it is at: it also
// catches a lease whose renewal or acquisition succeeded but whose answer was lost.
func (l *Leases) ReleaseAll(ctx context.Context, owner string) (int, error) {
	leases, readErr := l.leases(ctx) // a lease that could not be read expires instead; the rest go now
	l.mu.Lock()
	for h := range l.since {
		if h.owner == owner {
			delete(l.since, h)
		}
	}
	l.mu.Unlock()
	// The deletes go out together: one after another, a loaded cluster took more than the
	// five seconds a graceful stop allows for 32 of them, and the rest had to expire.
	var (
		mu   sync.Mutex
		n    int
		errs []error
		wg   sync.WaitGroup
	)
	for _, e := range leases {
		if leaseOf(e.Value()).Owner != owner {
			continue
		}
		wg.Go(func() {
			err := l.kv.Delete(ctx, e.Key(), jetstream.LastRevision(e.Revision()))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("releasing %s: %w", e.Key(), err))
				return
			}
			n++
		})
	}
	wg.Wait()
	return n, errors.Join(append(errs, readErr)...)
}

// Written says whether anything was ever written to the lease bucket: its stream's last
// sequence is past zero. (Expired keys leave the stream; the sequence stays.)
func (l *Leases) Written(ctx context.Context) (bool, error) {
	st, err := l.kv.Status(ctx)
	if err != nil {
		return true, fmt.Errorf("reading the lease bucket's status: %w", err)
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return true, nil // cannot tell: as if written
	}
	return bs.StreamInfo().State.LastSeq > 0, nil
}

// WatchLeases calls fn with every change to a lease or a heartbeat, those in place first
// (request.LeaseChange). A lease that expires makes no call: the store removes it without
// a trace.
// lost hears that the watch ended before stop was called.
func (l *Leases) WatchLeases(ctx context.Context, fn func(request.LeaseChange), lost func(error)) (stop func(), err error) {
	w, err := l.kv.Watch(ctx, ">")
	if err != nil {
		return nil, fmt.Errorf("watching leases: %w", err)
	}
	var stopped atomic.Bool
	go func() {
		for e := range w.Updates() {
			if e == nil {
				continue // the end of the leases in place
			}
			c := request.LeaseChange{Heartbeat: true, Released: e.Operation() != jetstream.KeyValuePut, Rev: e.Revision()}
			if rest, ok := strings.CutPrefix(e.Key(), leaseKeyPrefix); ok {
				if n, err := strconv.Atoi(rest); err == nil {
					c.Heartbeat, c.Partition = false, n
				}
			}
			// A heartbeat's key names its instance (its value is a time); a lease's value
			// names its owner. A release or a leaving (a delete) names nobody.
			switch {
			case c.Released:
			case c.Heartbeat:
				c.Owner = strings.TrimPrefix(e.Key(), memberKeyPrefix)
			default:
				c.Owner = leaseOf(e.Value()).Owner
			}
			fn(c)
		}
		if !stopped.Load() && ctx.Err() == nil {
			lost(errors.New("the lease watch's updates ended"))
		}
	}()
	return func() { stopped.Store(true); _ = w.Stop() }, nil
}

// Owners returns the current owner of every leased partition.
func (l *Leases) Owners(ctx context.Context) (map[int]string, error) {
	leases, err := l.leases(ctx)
	if err != nil {
		return nil, err
	}
	owners := map[int]string{}
	for _, e := range leases {
		if p, err := strconv.Atoi(strings.TrimPrefix(e.Key(), leaseKeyPrefix)); err == nil {
			owners[p] = leaseOf(e.Value()).Owner
		}
	}
	return owners, nil
}

// leases reads every live lease key. The key list is read first and each key after, so
// a key that expires in between is skipped.
func (l *Leases) leases(ctx context.Context) ([]jetstream.KeyValueEntry, error) {
	keys, err := l.listKeys(ctx, leaseKeyPrefix+">")
	if err != nil {
		return nil, fmt.Errorf("listing leases: %w", err)
	}
	return getAll(ctx, l.kv, keys)
}
