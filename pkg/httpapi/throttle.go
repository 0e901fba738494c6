package httpapi

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// Throttle slows the guessing of a secret (the console's sign-in, the admin API's
// token), per address: FreeTries wrong tries are let through; after them each try waits
// twice as long as the last, from a second up to ThrottleMaxWait; an address is
// forgotten ThrottleForget after its last refusal, or when it gets in. It keeps at most a
// bounded number of addresses; when full it forgets first an address that is not held
// back (fewer than FreeTries), the oldest such, and only then the oldest held back: a
// burst of single tries from many addresses cannot free one that is being held back.
type Throttle struct {
	mu    sync.Mutex
	by    map[string]refusal
	limit int
}

type refusal struct {
	n    int
	last time.Time
}

// The throttle's rules.
const (
	FreeTries       = 5
	ThrottleMaxWait = 5 * time.Minute
	ThrottleForget  = 15 * time.Minute
	// ThrottleAddresses is how many addresses a Throttle keeps at most.
	ThrottleAddresses = 10_000
)

// NewThrottle returns a throttle keeping up to limit addresses (ThrottleAddresses if 0).
func NewThrottle(limit int) *Throttle {
	if limit <= 0 {
		limit = ThrottleAddresses
	}
	return &Throttle{by: map[string]refusal{}, limit: limit}
}

// Wait is how long addr must wait before its next try; 0: it may try now.
func (t *Throttle) Wait(addr string, now time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.by[addr]
	if !ok || r.n < FreeTries || now.Sub(r.last) >= ThrottleForget {
		return 0
	}
	d := min(time.Second<<min(r.n-FreeTries, 16), ThrottleMaxWait)
	return max(0, r.last.Add(d).Sub(now))
}

// Refused counts a wrong try from addr.
func (t *Throttle) Refused(addr string, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.by[addr]; !ok && len(t.by) >= t.limit {
		t.evict(now)
	}
	r := t.by[addr]
	if now.Sub(r.last) >= ThrottleForget {
		r.n = 0
	}
	t.by[addr] = refusal{n: r.n + 1, last: now}
}

// evict makes room for one address: the forgotten go, else the oldest not held back,
// else the oldest.
func (t *Throttle) evict(now time.Time) {
	var free, held string
	var freeAt, heldAt time.Time
	for a, r := range t.by {
		switch {
		case now.Sub(r.last) >= ThrottleForget:
			delete(t.by, a)
		case r.n < FreeTries:
			if free == "" || r.last.Before(freeAt) {
				free, freeAt = a, r.last
			}
		default:
			if held == "" || r.last.Before(heldAt) {
				held, heldAt = a, r.last
			}
		}
	}
	if len(t.by) < t.limit {
		return
	}
	if free != "" {
		delete(t.by, free)
	} else {
		delete(t.by, held)
	}
}

// Forget clears addr's refusals (it got in).
func (t *Throttle) Forget(addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.by, addr)
}

// Len is how many addresses the throttle keeps now.
func (t *Throttle) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.by)
}

// ThrottleKey is the address a request counts under: its IP, or for IPv6 its /64 (one
// host commonly holds a whole /64, enough addresses for a try from each).
func ThrottleKey(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return host
	}
	if ip4 := ip.To4(); ip4 != nil {
		return ip4.String()
	}
	return (&net.IPNet{IP: ip.Mask(net.CIDRMask(64, 128)), Mask: net.CIDRMask(64, 128)}).String()
}
