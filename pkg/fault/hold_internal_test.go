package fault

import "testing"

// Bytes of a connection whose reset was seen are dropped, whatever the mode says: a
// copier woken by a Heal and by the reset at once must not let them through.
func TestHoldDropsTheBytesOfAResetConnection(t *testing.T) {
	t.Parallel()
	p := &Proxy{conns: map[*link]struct{}{}, changed: make(chan struct{})}
	wasReset := make(chan struct{})
	close(wasReset)
	for _, m := range []Mode{Pass, Blackhole} {
		p.mu.Lock()
		p.setMode(m)
		p.mu.Unlock()
		if p.hold(wasReset) {
			t.Fatalf("mode %d: bytes of a connection seen reset were let through", m)
		}
	}
}
