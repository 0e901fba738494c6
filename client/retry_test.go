package client

import (
	"testing"
	"time"
)

func TestRetryPolicyDelay(t *testing.T) {
	t.Parallel()
	p := RetryPolicy{Base: 100 * time.Millisecond, Max: 30 * time.Second}
	for n := range 80 {
		for _, retryAfter := range []time.Duration{0, 5 * time.Second} {
			ceiling := min(p.Max, p.Base<<min(n, 20))
			if retryAfter > 0 {
				ceiling = min(ceiling, retryAfter) // never more than twice what ingest asked
			}
			for range 50 {
				d := p.delay(n, retryAfter)
				if d < retryAfter || d > retryAfter+ceiling {
					t.Fatalf("delay(%d, %v) = %v; want within [%v, %v]", n, retryAfter, d, retryAfter, retryAfter+ceiling)
				}
			}
		}
	}
	// The jitter spreads: a thousand waits before the first retry are not all alike.
	seen := map[time.Duration]bool{}
	for range 1000 {
		seen[p.delay(0, 0)] = true
	}
	if len(seen) < 100 {
		t.Errorf("1000 first waits took %d values; want them spread over [0, Base]", len(seen))
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for value, want := range map[string]time.Duration{
		"":                              0,
		"5":                             5 * time.Second,
		" 2 ":                           2 * time.Second,
		"-1":                            0,
		"soon":                          0,
		"99999999999999":                maxRetryAfter,
		"Wed, 02 Jan 2030 03:04:15 GMT": 10 * time.Second,
		"Wed, 02 Jan 2030 03:04:00 GMT": 0,
	} {
		if got := parseRetryAfter(value, now); got != want {
			t.Errorf("parseRetryAfter(%q) = %v; want %v", value, got, want)
		}
	}
}
