package schedule

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
	// MaxAge: a request that fails transiently this long or longer after its first
	// attempt is dead-lettered instead of retried. Waiting in a backlog, behind its
	// client's earlier requests or for its Not-Before, never uses it up. When another
	// instance (or a restart) takes the client's partition over, it counts from an
	// earlier attempt the record holds (ADR 17). Defaults to 24h.
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
	if p.Interval <= 0 || p.Interval > request.MaxInterval {
		errs = append(errs, fmt.Errorf("interval %s: must be positive and at most %s", p.Interval, request.MaxInterval))
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
// when its age starts, its first attempt (zero: it has no age): MaxAge bounds how long a
// request is retried once it could go, not how long it waited for its Not-Before or
// behind its client's earlier requests.
func (p Policy) GiveUp(attempt int, dueSince, now time.Time) request.Reason {
	switch {
	case attempt >= p.MaxAttempts:
		return request.ReasonAttemptsExhausted
	case !dueSince.IsZero() && now.Sub(dueSince) >= p.MaxAge:
		return request.ReasonAgeExhausted
	}
	return ""
}
