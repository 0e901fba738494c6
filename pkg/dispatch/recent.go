package dispatch

import (
	"sync"
	"time"
)

// DefaultRecentDeliveries is how many deliveries an instance remembers by id, for
// operators asking what became of a request.
const DefaultRecentDeliveries = 10_000

// Delivery is what an instance remembers of a request raven accepted.
type Delivery struct {
	ID        string    `json:"id"`
	Subject   string    `json:"subject"`
	Attempt   int       `json:"attempt"`
	Delivered time.Time `json:"deliveredAt" was:"delivered_at"`
}

// recent remembers the last n deliveries, in a ring; safe for concurrent use.
type recent struct {
	mu   sync.Mutex
	ring []Delivery
	next int
	byID map[string]int // id -> position in ring
}

func newRecent(n int) *recent {
	if n <= 0 {
		return nil
	}
	return &recent{ring: make([]Delivery, 0, n), byID: make(map[string]int, n)}
}

func (r *recent) add(d Delivery) {
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

func (r *recent) get(id string) (Delivery, bool) {
	if r == nil {
		return Delivery{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := r.byID[id]
	if !ok {
		return Delivery{}, false
	}
	return r.ring[i], true
}

// Delivered says whether this instance delivered the request with this id lately (among
// its last RecentDeliveries), and when. Safe to call from any goroutine.
func (d *Dispatcher) Delivered(id string) (Delivery, bool) { return d.recent.get(id) }
