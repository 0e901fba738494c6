package ingest

import (
	"math"
	"net/http"
	"testing"
	"time"
)

// Prefer is read as RFC 7240 has it: preferences comma-separated, over several header
// lines, names without case, a value quoted or not, parameters after a semicolon, the
// others ignored; a wait that is no whole number of seconds, or two waits, refused.
func TestPreferWait(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		lines []string
		wait  time.Duration
		found bool
		bad   bool
	}{
		{nil, 0, false, false},
		{[]string{"respond-async"}, 0, false, false},
		{[]string{"wait=10"}, 10 * time.Second, true, false},
		{[]string{"respond-async, Wait=5"}, 5 * time.Second, true, false},
		{[]string{"handling=lenient", `wait="7"`}, 7 * time.Second, true, false},
		{[]string{"wait=3; foo=bar"}, 3 * time.Second, true, false},
		{[]string{"wait=0"}, 0, true, false},
		{[]string{"wait=x"}, 0, false, true},
		{[]string{"wait"}, 0, false, true},
		{[]string{"wait=-2"}, 0, false, true},
		// Too many seconds to count is more than any cap, not a mistake: cut as
		// wait=100000 is (it was refused).
		{[]string{"wait=99999999999999999999"}, math.MaxUint32 * time.Second, true, false},
		{[]string{"wait=1", "wait=2"}, 0, false, true},
	} {
		h := http.Header{}
		for _, l := range c.lines {
			h.Add("Prefer", l)
		}
		wait, found, p := preferWait(h)
		if (p != nil) != c.bad || wait != c.wait || found != c.found {
			t.Errorf("Prefer %q: %s %v %v, want %s %v, refused %v", c.lines, wait, found, p, c.wait, c.found, c.bad)
		}
		if p != nil && (p.Status != http.StatusBadRequest || p.Code != "prefer_wait_invalid") {
			t.Errorf("Prefer %q refused as %d %s", c.lines, p.Status, p.Code)
		}
	}
}
