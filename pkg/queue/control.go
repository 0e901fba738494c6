package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// ControlBucket is the KV bucket that holds operators' steering: the global interval and
// per-client settings. Every dispatcher watches it, so a change reaches all of them at
// once, and it is stored like the streams, so it survives restarts.
const ControlBucket = "DISPATCH_CONTROL"

const (
	globalKey        = "global"
	budgetKey        = "budget"
	clientKeyPrefix  = "client."
	controlHistory   = 5
	maxSteerAttempts = 20
)

// Control reads and changes the control bucket.
type Control struct {
	kv  jetstream.KeyValue
	log zerolog.Logger
}

// Control opens the control bucket, creating it if it is missing. log hears of records
// that cannot be read (they are ignored) and of a watch that ends.
func (q *Queue) Control(ctx context.Context, log zerolog.Logger) (*Control, error) {
	kv, err := q.bucket(ctx, jetstream.KeyValueConfig{
		Bucket:      ControlBucket,
		Description: "Operators' steering of the dispatcher: global interval, per-client interval, pause, purge.",
		History:     controlHistory,
	})
	if err != nil {
		return nil, err
	}
	return &Control{kv: kv, log: log}, nil
}

func clientKey(clientID string) string { return clientKeyPrefix + request.EncodeClientID(clientID) }

// Global returns the global record; the zero request.Steering when none was set.
func (c *Control) Global(ctx context.Context) (request.Steering, error) {
	s, _, err := c.get(ctx, globalKey)
	return s, err
}

// SetGlobalInterval sets the global interval; zero goes back to each dispatcher's
// configured DISPATCH_INTERVAL. changed is false when it was so already (nothing is
// written). A change is written with who made it, so that the dispatchers log it; a
// change back to the configured interval is then deleted, leaving no record.
func (c *Control) SetGlobalInterval(ctx context.Context, d time.Duration, by string) (changed bool, err error) {
	if d < 0 {
		return false, fmt.Errorf("interval %s: must not be negative", d)
	}
	cur, _, err := c.get(ctx, globalKey)
	if err != nil {
		return false, err
	}
	if time.Duration(cur.Interval) == d {
		return false, nil
	}
	rev, err := c.kv.Put(ctx, globalKey, marshal(request.Steering{Interval: request.Duration(d), UpdatedAt: time.Now().UTC(), By: by}))
	if err != nil {
		return false, fmt.Errorf("writing %s: %w", globalKey, err)
	}
	if d == 0 {
		c.dropCleared(ctx, globalKey, rev)
	}
	return true, nil
}

// dropCleared deletes a record that steers nothing, if it is still at rev: the dispatchers
// have the record (and who cleared it) from the watch, and a kept record would be read
// by every dispatcher at every start. Failing, the record stays; it steers nothing.
func (c *Control) dropCleared(ctx context.Context, key string, rev uint64) {
	_ = c.kv.Delete(ctx, key, jetstream.LastRevision(rev))
}

func marshal(s request.Steering) []byte {
	b, _ := json.Marshal(s) // plain fields: it cannot fail
	return b
}

// Client returns clientID's record; the zero request.Steering when none was set.
func (c *Control) Client(ctx context.Context, clientID string) (request.Steering, error) {
	s, _, err := c.get(ctx, clientKey(clientID))
	return s, err
}

// UpdateClient changes clientID's record with change, by compare-and-swap, so that two
// operators changing different fields at once both take effect. A record left steering
// nothing is written (with who cleared it), then deleted; a change that changes nothing
// is not written, and the record as it was is returned.
func (c *Control) UpdateClient(ctx context.Context, clientID, by string, change func(*request.Steering)) (request.Steering, error) {
	key := clientKey(clientID)
	for range maxSteerAttempts {
		s, rev, err := c.get(ctx, key)
		if err != nil {
			return request.Steering{}, err
		}
		was := s
		change(&s)
		if s.Same(was) {
			return was, nil // already so: nothing to write, nothing for the dispatchers to apply
		}
		s.UpdatedAt, s.By = time.Now().UTC(), by
		// A record left steering nothing is written first, saying who cleared it, so
		// that the dispatchers log by whom; then it is dropped.
		var newRev uint64
		if rev == 0 {
			newRev, err = c.kv.Create(ctx, key, marshal(s))
		} else {
			newRev, err = c.kv.Update(ctx, key, marshal(s), rev)
		}
		if err == nil {
			if s.IsZero() {
				c.dropCleared(ctx, key, newRev)
			}
			return s, nil
		}
		if !isWrongRevision(err) {
			return request.Steering{}, fmt.Errorf("steering client %q: %w", clientID, err)
		}
	}
	return request.Steering{}, fmt.Errorf("steering client %q: too many concurrent changes; try again", clientID)
}

func isWrongRevision(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyExists) ||
		(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence)
}

// Clients lists every client that has a record, by clientId.
func (c *Control) Clients(ctx context.Context) (map[string]request.Steering, error) {
	out := map[string]request.Steering{}
	lister, err := c.kv.ListKeysFiltered(ctx, clientKeyPrefix+">")
	if err != nil {
		return nil, fmt.Errorf("listing steered clients: %w", err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	for _, k := range keys {
		id, err := request.DecodeClientID(strings.TrimPrefix(k, clientKeyPrefix))
		if err != nil {
			continue // not written by this service
		}
		s, _, err := c.get(ctx, k)
		if err != nil {
			return nil, err
		}
		if !s.IsZero() {
			out[id] = s
		}
	}
	return out, nil
}

// WatchSteering returns the steering in force now, then calls fn with every change
// until stop is called or ctx ends (it is the dispatcher's Steering). A record that
// cannot be read is logged and skipped, and so is a watch that ends on its own.
func (c *Control) WatchSteering(ctx context.Context, fn func(request.SteerChange)) (current []request.SteerChange, stop func(), err error) {
	onBad := func(key string, err error) {
		if key == "" {
			c.log.Error().Err(err).Msg("steering watch lost")
			return
		}
		c.log.Error().Err(err).Str("key", key).Msg("steering record cannot be read; ignoring it: fix it with dispatchctl")
	}
	w, err := c.kv.WatchAll(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("watching control bucket: %w", err)
	}
	event := func(e jetstream.KeyValueEntry) (request.SteerChange, bool) {
		var ev request.SteerChange
		switch k := e.Key(); {
		case k == globalKey:
		case k == budgetKey:
			ev.Budget = &request.Budget{}
			if e.Operation() != jetstream.KeyValuePut {
				return ev, true // deleted: back to the configured budget
			}
			if err := json.Unmarshal(e.Value(), ev.Budget); err != nil {
				onBad(e.Key(), err)
				return ev, false
			}
			if err := ev.Budget.Validate(); err != nil { // written by hand, not by UpdateBudget
				onBad(e.Key(), err)
				return ev, false
			}
			return ev, true
		case strings.HasPrefix(k, clientKeyPrefix):
			ev.Client = strings.TrimPrefix(k, clientKeyPrefix)
		default:
			return ev, false
		}
		if e.Operation() != jetstream.KeyValuePut {
			return ev, true // deleted: back to the defaults
		}
		if err := json.Unmarshal(e.Value(), &ev.Steering); err != nil {
			onBad(e.Key(), err)
			return ev, false
		}
		return ev, true
	}
	for {
		select {
		case <-ctx.Done():
			_ = w.Stop()
			return nil, nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, nil, errors.New("control bucket watch closed")
			}
			if e == nil { // the current records are all in
				var stopped atomic.Bool
				go func() {
					for e := range w.Updates() {
						if e == nil {
							continue
						}
						if ev, ok := event(e); ok {
							fn(ev)
						}
					}
					if ctx.Err() == nil && !stopped.Load() {
						onBad("", errors.New("the control bucket watch ended: steering changes are no longer seen until restart"))
					}
				}()
				return current, func() { stopped.Store(true); _ = w.Stop() }, nil
			}
			if ev, ok := event(e); ok {
				current = append(current, ev)
			}
		}
	}
}

func (c *Control) get(ctx context.Context, key string) (request.Steering, uint64, error) {
	var s request.Steering
	rev, err := c.getJSON(ctx, key, &s)
	return s, rev, err
}

// getJSON reads key's record into v; the revision is 0 (and v untouched) when there is
// none.
func (c *Control) getJSON(ctx context.Context, key string, v any) (uint64, error) {
	e, err := c.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", key, err)
	}
	if err := json.Unmarshal(e.Value(), v); err != nil {
		return 0, fmt.Errorf("record %s is not valid: %w", key, err)
	}
	return e.Revision(), nil
}

// Budget returns raven's budget as operators set it; the zero request.Budget (the
// configured one in force) when none was set.
func (c *Control) Budget(ctx context.Context) (request.Budget, error) {
	var b request.Budget
	_, err := c.getJSON(ctx, budgetKey, &b)
	return b, err
}

// UpdateBudget changes raven's budget with change, by compare-and-swap, as UpdateClient
// does a client's record: a change that changes nothing is not written, and a record
// left overriding nothing is written (with who cleared it), then deleted.
func (c *Control) UpdateBudget(ctx context.Context, by string, change func(*request.Budget)) (request.Budget, error) {
	for range maxSteerAttempts {
		var b request.Budget
		rev, err := c.getJSON(ctx, budgetKey, &b)
		if err != nil {
			return request.Budget{}, err
		}
		was := b
		change(&b)
		if err := b.Validate(); err != nil {
			return request.Budget{}, err
		}
		if b.Same(was) {
			return was, nil
		}
		b.UpdatedAt, b.By = time.Now().UTC(), by
		data, _ := json.Marshal(b)
		var newRev uint64
		if rev == 0 {
			newRev, err = c.kv.Create(ctx, budgetKey, data)
		} else {
			newRev, err = c.kv.Update(ctx, budgetKey, data, rev)
		}
		if err == nil {
			if b.IsZero() {
				c.dropCleared(ctx, budgetKey, newRev)
			}
			return b, nil
		}
		if !isWrongRevision(err) {
			return request.Budget{}, fmt.Errorf("setting raven's budget: %w", err)
		}
	}
	return request.Budget{}, errors.New("setting raven's budget: too many concurrent changes; try again")
}
