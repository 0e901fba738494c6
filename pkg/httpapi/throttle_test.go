package httpapi_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/httpapi"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// wrong makes n wrong tries from addr at now and fails unless each is let through.
func wrong(t testing.TB, th *httpapi.Throttle, addr string, now time.Time, n int) {
	t.Helper()
	for i := range n {
		if w, _ := th.Wrong(addr, now); w != 0 {
			t.Fatalf("%s: wrong try %d refused for %s, want it let through", addr, i+1, w)
		}
	}
}

func TestThrottleWaitsLongerEachTimeAndForgets(t *testing.T) {
	t.Parallel()
	th := httpapi.NewThrottle(httpapi.ThrottleConfig{})
	wrong(t, th, "a", t0, httpapi.FreeTries)
	if w, everyone := th.Wrong("a", t0); w != time.Second || everyone {
		t.Fatalf("after %d wrong tries the wait is %s (everyone %v), want 1s for this address", httpapi.FreeTries, w, everyone)
	}
	wrong(t, th, "b", t0, 1) // another address is not held back
	now := t0
	for _, want := range []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second} {
		now = now.Add(want / 2) // the last wait is over: the next try is let through, and doubles it
		wrong(t, th, "a", now, 1)
		if w, _ := th.Wrong("a", now); w != want {
			t.Fatalf("the wait is %s, want %s", w, want)
		}
	}
	for range 20 {
		now = now.Add(httpapi.ThrottleMaxWait)
		wrong(t, th, "a", now, 1)
	}
	if w, _ := th.Wrong("a", now); w != httpapi.ThrottleMaxWait {
		t.Fatalf("many more: the wait is %s, want at most %s", w, httpapi.ThrottleMaxWait)
	}
	now = now.Add(httpapi.ThrottleForget)
	wrong(t, th, "a", now, httpapi.FreeTries) // forgotten: free tries again
	if n := th.Len(); n != 1 {
		t.Fatalf("%d addresses kept, want 1 (b forgotten)", n)
	}
}

// Wrong tries from many addresses, each within its free tries, are bounded together:
// once the burst is spent each is refused until the bucket gains one more.
func TestThrottleBoundsWrongTriesFromAllAddresses(t *testing.T) {
	t.Parallel()
	th := httpapi.NewThrottle(httpapi.ThrottleConfig{})
	for i := range httpapi.WrongTriesBurst {
		wrong(t, th, fmt.Sprintf("10.0.%d.%d", i/256, i%256), t0, 1)
	}
	w, everyone := th.Wrong("192.0.2.1", t0)
	if w != httpapi.WrongTryEvery || !everyone {
		t.Fatalf("past the burst, a new address: refused for %s (everyone %v), want %s for everyone", w, everyone, httpapi.WrongTryEvery)
	}
	now := t0.Add(httpapi.WrongTryEvery)
	wrong(t, th, "192.0.2.1", now, 1)
	if w, everyone := th.Wrong("192.0.2.2", now); w == 0 || !everyone {
		t.Fatalf("the bucket gained one, which was taken: another try refused for %s (everyone %v), want refused for everyone", w, everyone)
	}
}

// A flood of wrong tries from new addresses frees no address the throttle keeps
// (issue 59, finding 6: at 10,000 addresses each new one scanned the table and freed an
// older one); the throttle keeps no more than its limit, and the addresses it cannot
// keep are still bounded by the bucket.
func TestThrottleKeepsItsAddressesThroughAFlood(t *testing.T) {
	t.Parallel()
	const limit = 100
	th := httpapi.NewThrottle(httpapi.ThrottleConfig{Addresses: limit, Burst: 1 << 20})
	wrong(t, th, "guesser", t0, httpapi.FreeTries)
	wrong(t, th, "guesser", t0.Add(time.Second), 1) // the wait is now 2 s
	wrong(t, th, "slow", t0, 1)
	for i := range 10 * limit {
		wrong(t, th, fmt.Sprintf("127.1.%d.%d", i/256, i%256), t0.Add(time.Second), 1)
	}
	if n := th.Len(); n != limit {
		t.Fatalf("%d addresses kept, want %d", n, limit)
	}
	// Both are still counted: the guesser's next try is let through and then waits
	// 4 s, not nothing; the slow one has 1 try spent, not 0.
	now := t0.Add(3 * time.Second)
	wrong(t, th, "guesser", now, 1)
	if w, _ := th.Wrong("guesser", now); w != 4*time.Second {
		t.Fatalf("after the flood the guesser waits %s, want 4s", w)
	}
	wrong(t, th, "slow", now, httpapi.FreeTries-1)
	if w, _ := th.Wrong("slow", now); w != time.Second {
		t.Fatalf("after the flood the slow one waits %s after %d more tries, want 1s", w, httpapi.FreeTries-1)
	}
	// Once every address is forgotten the room is there again.
	wrong(t, th, "late", now.Add(httpapi.ThrottleForget), 1)
	if n := th.Len(); n != 1 {
		t.Fatalf("%d addresses kept after all were forgotten and one came, want 1", n)
	}
}

// IPv6 addresses count by their /56: a site commonly holds one, or a /48 (256 of them).
func TestThrottleKeyIsTheIPv6Slash56(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ remote, want string }{
		{"127.0.0.1:5000", "127.0.0.1"},
		{"[2001:db8:1:2:aaaa::1]:5000", "2001:db8:1::/56"},
		{"[2001:db8:1:ff:bbbb::7]:6000", "2001:db8:1::/56"},
		{"[2001:db8:1:100::7]:6000", "2001:db8:1:100::/56"},
		{"[::1]:80", "::/56"},
		{"[::ffff:10.0.0.1]:80", "10.0.0.1"},
	} {
		if got := httpapi.ThrottleKey(&http.Request{RemoteAddr: c.remote}); got != c.want {
			t.Errorf("%s counts under %q, want %q", c.remote, got, c.want)
		}
	}
}

// BenchmarkThrottleNewAddresses is wrong tries from 2,000 new addresses at a throttle
// full of addresses (issue 59, finding 6: 0.77 s when each scanned the table).
func BenchmarkThrottleNewAddresses(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		th := httpapi.NewThrottle(httpapi.ThrottleConfig{Burst: 1 << 20})
		for i := range httpapi.ThrottleAddresses {
			th.Wrong(fmt.Sprintf("10.%d.%d.1", i/256, i%256), t0)
		}
		addrs := make([]string, 2000)
		for i := range addrs {
			addrs[i] = fmt.Sprintf("172.16.%d.%d", i/256, i%256)
		}
		b.StartTimer()
		for _, a := range addrs {
			th.Wrong(a, t0)
		}
	}
}
