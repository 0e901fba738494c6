package dispatch

import (
	"errors"
	"fmt"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Defaults for Policy.
const (
	DefaultInterval    = 5 * time.Second
	DefaultBackoffBase = time.Second
	DefaultBackoffMax  = 5 * time.Minute
	DefaultJitter      = 0.2
	DefaultMaxAttempts = 25
	DefaultMaxAge      = 24 * time.Hour
)

// Policy says when a client's next attempt may start and when a request is given up.
type Policy struct {
	// Interval is the least time between the end of one attempt for a client and the
	// start of the next. Defaults to 5s.
	Interval time.Duration
	// BackoffBase is the wait after a request's first transient failure; it doubles with
	// each further failure. A retry never starts sooner than Interval whatever the backoff
	// says. Defaults to 1s.
	BackoffBase time.Duration
	// BackoffMax caps the backoff. Defaults to 5m.
	BackoffMax time.Duration
	// Jitter is the fraction of the backoff taken off at random, so that clients that
	// failed together do not retry together: a backoff b waits between b*(1-Jitter) and
	// b. Defaults to 0.2.
	Jitter float64
	// MaxAttempts is how many attempts a request gets before it is dead-lettered.
	// Defaults to 25.
	MaxAttempts int
	// MaxAge: a request that fails transiently when it is older than this (since it was
	// accepted, or since its Not-Before when that is later) is dead-lettered instead of
	// retried. Waiting in a backlog, or for its Not-Before, alone never dead-letters a
	// request. Defaults to 24h.
	MaxAge time.Duration
}

// WithDefaults returns p with zero fields set to their defaults.
func (p Policy) WithDefaults() Policy {
	if p.Interval == 0 {
		p.Interval = DefaultInterval
	}
	if p.BackoffBase == 0 {
		p.BackoffBase = DefaultBackoffBase
	}
	if p.BackoffMax == 0 {
		p.BackoffMax = DefaultBackoffMax
	}
	if p.Jitter == 0 {
		p.Jitter = DefaultJitter
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.MaxAge == 0 {
		p.MaxAge = DefaultMaxAge
	}
	return p
}

// Validate reports every field that cannot work.
func (p Policy) Validate() error {
	var errs []error
	if p.Interval <= 0 {
		errs = append(errs, fmt.Errorf("interval %s: must be positive", p.Interval))
	}
	if p.BackoffBase <= 0 || p.BackoffMax < p.BackoffBase {
		errs = append(errs, fmt.Errorf("backoff %s..%s: base must be positive and max at least base", p.BackoffBase, p.BackoffMax))
	}
	if p.Jitter < 0 || p.Jitter >= 1 {
		errs = append(errs, fmt.Errorf("jitter %v: must be at least 0 and below 1", p.Jitter))
	}
	if p.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("max attempts %d: must be at least 1", p.MaxAttempts))
	}
	if p.MaxAge <= 0 {
		errs = append(errs, fmt.Errorf("max age %s: must be positive", p.MaxAge))
	}
	return errors.Join(errs...)
}

// Backoff is the jittered backoff after the attempt-th consecutive transient failure of a
// request; rnd is a number in [0, 1).
func (p Policy) Backoff(attempt int, rnd float64) time.Duration {
	b := p.BackoffBase
	for i := 1; i < attempt && b < p.BackoffMax; i++ {
		b *= 2
	}
	b = min(b, p.BackoffMax)
	return b - time.Duration(float64(b)*p.Jitter*rnd)
}

// GiveUp says whether a request that just failed transiently on its attempt-th try should
// be dead-lettered, and why; the reason is empty when it should be retried. dueSince is
// when its age starts: when it was accepted, or its Not-Before when that is later; zero:
// it has no age.
func (p Policy) GiveUp(attempt int, dueSince, now time.Time) string {
	switch {
	case attempt >= p.MaxAttempts:
		return request.ReasonAttemptsExhausted
	case !dueSince.IsZero() && now.Sub(dueSince) >= p.MaxAge:
		return request.ReasonAgeExhausted
	}
	return ""
}

// ageFrom is when st's age, the one MaxAge bounds, starts: when the queue stored it, or
// its Not-Before when that is later. A request held back by its Not-Before has not been
// waiting to go, and must not use up its MaxAge before it may be attempted at all.
func ageFrom(st request.Stored) time.Time {
	if st.NotBefore.After(st.AcceptedAt) {
		return st.NotBefore
	}
	return st.AcceptedAt
}
