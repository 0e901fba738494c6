package dispatch

import (
	"sync"

	"github.com/penguinhq/dispatcher/pkg/introspect"
)

// DefaultRecentDeliveries is how many deliveries an instance remembers by id, for
// operators asking what became of a request.
const DefaultRecentDeliveries = 10_000

// recent remembers the last n deliveries, in a ring; safe for concurrent use.
type recent struct {
	mu   sync.Mutex
	ring []introspect.Delivery
	next int
	byID map[string]int // id -> position in ring
}

func newRecent(n int) *recent {
	if n <= 0 {
		return nil
	}
	return &recent{ring: make([]introspect.Delivery, 0, n), byID: make(map[string]int, n)}
}

func (r *recent) add(d introspect.Delivery) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.ring) < cap(r.ring) {
		r.byID[d.ID] = len(r.ring)
		r.ring = append(r.ring, d)
		return
	}
	if old := r.ring[r.next]; r.byID[old.ID] == r.next {
		delete(r.byID, old.ID)
	}
	r.ring[r.next] = d
	r.byID[d.ID] = r.next
	r.next = (r.next + 1) % len(r.ring)
}

func (r *recent) get(id string) (introspect.Delivery, bool) {
	if r == nil {
		return introspect.Delivery{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := r.byID[id]
	if !ok {
		return introspect.Delivery{}, false
	}
	return r.ring[i], true
}

// Delivered says whether this instance delivered the request with this id lately (among
// its last RecentDeliveries), and when. Safe to call from any goroutine.
func (d *Dispatcher) Delivered(id string) (introspect.Delivery, bool) { return d.recent.get(id) }
