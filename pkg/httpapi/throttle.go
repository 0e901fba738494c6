package httpapi

import (
	"container/list"
	"net"
	"net/http"
	"sync"
	"time"
)

// Throttle bounds the wrong tries at a secret (the admin API's token, the console's
// sign-in). It is asked only about a wrong try: a right token passes whatever its
// address did, so operators who share an address with a guesser (a NAT, a bastion, a
// proxy) are never locked out by it. It bounds wrong tries twice:
//
//   - per address (ThrottleKey): FreeTries are let through; after them each wrong try
//     waits twice as long as the last, from a second up to ThrottleMaxWait; an address is
//     forgotten ThrottleForget after its last wrong try let through;
//   - across all addresses: a bucket of ThrottleConfig.Burst wrong tries, one more every
//     ThrottleConfig.Every; while it is empty every wrong try is refused.
//
// A refused try is not counted. It keeps at most ThrottleConfig.Addresses addresses,
// forgotten oldest first in constant time; when it is full, a wrong try from an address
// it does not keep is bounded by the bucket alone: a flood of new addresses frees none
// of those it keeps.
type Throttle struct {
	cfg    ThrottleConfig
	mu     sync.Mutex
	by     map[string]*list.Element // of *tries
	order  list.List                // the *tries, the latest counted in front
	tokens float64                  // wrong tries the bucket holds
	filled time.Time                // when tokens was last brought up to date
}

type tries struct {
	addr string
	n    int
	last time.Time
}

// The throttle's rules.
const (
	FreeTries       = 5
	ThrottleMaxWait = 5 * time.Minute
	ThrottleForget  = 15 * time.Minute
	// ThrottleAddresses is how many addresses a Throttle keeps by default.
	ThrottleAddresses = 10_000
	// WrongTriesBurst is how many wrong tries from all addresses together a Throttle
	// lets through at once by default.
	WrongTriesBurst = 100
	// WrongTryEvery is how often, by default, the bucket of wrong tries gains one.
	WrongTryEvery = time.Second
)

// ThrottleConfig bounds a Throttle.
type ThrottleConfig struct {
	// Addresses is how many addresses it keeps at most. Defaults to ThrottleAddresses.
	Addresses int
	// Burst is how many wrong tries from all addresses together it lets through at once.
	// Defaults to WrongTriesBurst.
	Burst int
	// Every is how often one more wrong try across all addresses is let through once
	// the burst is spent. Defaults to WrongTryEvery.
	Every time.Duration
}

// NewThrottle returns a throttle bounded by cfg.
func NewThrottle(cfg ThrottleConfig) *Throttle {
	if cfg.Addresses <= 0 {
		cfg.Addresses = ThrottleAddresses
	}
	if cfg.Burst <= 0 {
		cfg.Burst = WrongTriesBurst
	}
	if cfg.Every <= 0 {
		cfg.Every = WrongTryEvery
	}
	return &Throttle{cfg: cfg, by: map[string]*list.Element{}, tokens: float64(cfg.Burst)}
}

// Wrong is asked about a wrong try from addr at now. wait 0: the try is let through (and
// counted); answer that it is wrong. Otherwise it is refused for wait, by its address's
// wrong tries or, when everyone, by those of all addresses together.
func (t *Throttle) Wrong(addr string, now time.Time) (wait time.Duration, everyone bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for e := t.order.Back(); e != nil && forgotten(e.Value.(*tries), now); e = t.order.Back() {
		delete(t.by, e.Value.(*tries).addr)
		t.order.Remove(e)
	}
	e := t.by[addr]
	if e != nil {
		if w := e.Value.(*tries).wait(now); w > 0 {
			return w, false
		}
	}
	if w := t.take(now); w > 0 {
		return w, true
	}
	switch {
	case e != nil:
		t.order.MoveToFront(e)
	case len(t.by) < t.cfg.Addresses:
		e = t.order.PushFront(&tries{addr: addr})
		t.by[addr] = e
	default: // full: the bucket alone bounds this address
		return 0, false
	}
	r := e.Value.(*tries)
	if forgotten(r, now) { // kept a moment longer than ThrottleForget: now is not monotonic across callers
		r.n = 0
	}
	r.n, r.last = r.n+1, now
	return 0, false
}

func forgotten(r *tries, now time.Time) bool { return now.Sub(r.last) >= ThrottleForget }

// wait is how long the address must wait before its next wrong try is let through.
func (r *tries) wait(now time.Time) time.Duration {
	if r.n < FreeTries || forgotten(r, now) {
		return 0
	}
	d := min(time.Second<<min(r.n-FreeTries, 16), ThrottleMaxWait)
	return max(0, r.last.Add(d).Sub(now))
}

// take takes a wrong try from the bucket: 0, or how long until it holds one.
func (t *Throttle) take(now time.Time) time.Duration {
	if d := now.Sub(t.filled); d > 0 {
		t.tokens = min(float64(t.cfg.Burst), t.tokens+float64(d)/float64(t.cfg.Every))
		t.filled = now
	}
	if t.tokens >= 1 {
		t.tokens--
		return 0
	}
	return time.Duration((1 - t.tokens) * float64(t.cfg.Every))
}

// Len is how many addresses the throttle keeps now.
func (t *Throttle) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.by)
}

// ThrottleKey is the address a request counts under: its IP, or for IPv6 its /56 (a
// site is commonly given a /56 or a /48, so one host may try from many /64s; a /48 holds
// 256 /56s, far fewer than a Throttle keeps).
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
	return (&net.IPNet{IP: ip.Mask(net.CIDRMask(56, 128)), Mask: net.CIDRMask(56, 128)}).String()
}
