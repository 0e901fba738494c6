package governor

import "time"

// bucket is a token bucket: rate tokens a second, up to burst. A token taken for a turn
// that made no attempt (the lane turned out empty, paused, held) is given back, which
// x/time/rate cannot do once the reservation's time has passed.
type bucket struct {
	rate, burst, tokens float64
	last                time.Time
}

func (b *bucket) fill(now time.Time) {
	if now.After(b.last) {
		if !b.last.IsZero() {
			b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
		}
		b.last = now
	}
}

// set changes the rate at now; a bucket set for the first time starts full.
func (b *bucket) set(rate float64, now time.Time) {
	first := b.last.IsZero()
	b.fill(now)
	b.last = now
	b.rate, b.burst = rate, max(1, rate*burstWindow.Seconds())
	if first {
		b.tokens = b.burst
	}
	b.tokens = min(b.tokens, b.burst)
}

// ready says whether a token is there at now, and if not, when one will be.
func (b *bucket) ready(now time.Time) (bool, time.Time) {
	b.fill(now)
	if b.tokens >= 1-1e-9 { // not held back by a rounding of the fill
		return true, time.Time{}
	}
	if b.rate <= 0 {
		return false, time.Time{}
	}
	wait := min((1-b.tokens)/b.rate, 3600) // a tiny rate must not overflow the wait
	return false, now.Add(time.Duration(wait * float64(time.Second)))
}

func (b *bucket) take() { b.tokens-- }

func (b *bucket) refund() { b.tokens = min(b.burst, b.tokens+1) }
