package httpapi_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/httpapi"
)

func TestThrottleWaitsLongerEachTimeAndForgets(t *testing.T) {
	t.Parallel()
	th := httpapi.NewThrottle(0)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for range httpapi.FreeTries {
		th.Refused("a", t0)
	}
	if w := th.Wait("a", t0); w != time.Second {
		t.Fatalf("after %d refusals the wait is %s, want 1s", httpapi.FreeTries, w)
	}
	if w := th.Wait("b", t0); w != 0 {
		t.Fatalf("another address waits %s, want 0", w)
	}
	th.Refused("a", t0)
	th.Refused("a", t0)
	if w := th.Wait("a", t0); w != 4*time.Second {
		t.Fatalf("two more: the wait is %s, want 4s", w)
	}
	for range 30 {
		th.Refused("a", t0)
	}
	if w := th.Wait("a", t0); w != httpapi.ThrottleMaxWait {
		t.Fatalf("many more: the wait is %s, want at most %s", w, httpapi.ThrottleMaxWait)
	}
	if w := th.Wait("a", t0.Add(httpapi.ThrottleForget)); w != 0 {
		t.Fatalf("%s later the wait is %s, want it forgotten", httpapi.ThrottleForget, w)
	}
	th.Forget("a")
	if w := th.Wait("a", t0); w != 0 {
		t.Fatalf("after a sign-in the wait is %s, want 0", w)
	}
}

// A burst of wrong tries from many addresses does not free an address that is held
// back (issue 35, finding 7: at 10,000 addresses the map was replaced by an empty one,
// and a throttled address got 401 again instead of 429); the throttle keeps no more
// than its limit.
func TestThrottleKeepsWhoIsHeldBackThroughABurst(t *testing.T) {
	t.Parallel()
	const limit = 100
	th := httpapi.NewThrottle(limit)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for range httpapi.FreeTries + 3 {
		th.Refused("guesser", t0)
	}
	held := th.Wait("guesser", t0)
	if held == 0 {
		t.Fatal("the guesser is not held back")
	}
	for i := range 10 * limit {
		th.Refused(fmt.Sprintf("127.1.%d.%d", i/256, i%256), t0.Add(time.Duration(i)*time.Millisecond))
	}
	if n := th.Len(); n > limit {
		t.Fatalf("%d addresses kept, want at most %d", n, limit)
	}
	if w := th.Wait("guesser", t0); w != held {
		t.Fatalf("after the burst the guesser waits %s, want still %s", w, held)
	}
}

// IPv6 addresses count by their /64: one host holds enough of them for a try from each.
func TestThrottleKeyIsTheIPv6Slash64(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ remote, want string }{
		{"127.0.0.1:5000", "127.0.0.1"},
		{"[2001:db8:1:2:aaaa::1]:5000", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:bbbb::7]:6000", "2001:db8:1:2::/64"},
		{"[::1]:80", "::/64"},
		{"[::ffff:10.0.0.1]:80", "10.0.0.1"},
	} {
		if got := httpapi.ThrottleKey(&http.Request{RemoteAddr: c.remote}); got != c.want {
			t.Errorf("%s counts under %q, want %q", c.remote, got, c.want)
		}
	}
}
