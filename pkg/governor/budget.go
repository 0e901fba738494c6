package governor

import (
	"errors"
	"fmt"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Budget limits attempts to raven across all dispatcher instances together; a zero field
// is no limit. Each instance holds itself to its share: the budget times the part of the
// partitions it may send for (ADR 7).
type Budget struct {
	// MaxRate is attempts per second.
	MaxRate float64
	// MaxInFlight is attempts in flight at once.
	MaxInFlight int
}

// Validate reports a limit that cannot work.
func (b Budget) Validate() error { return request.ValidateBudget(b.MaxRate, b.MaxInFlight) }

// Defaults for Adaptive (ADR 7 says how they were chosen).
const (
	DefaultAdaptiveThreshold = 0.02
	DefaultAdaptiveDecrease  = 0.85
	DefaultAdaptiveIncrease  = 0.05
	DefaultAdaptivePeriod    = time.Second
	DefaultAdaptiveMaxPause  = 5 * time.Minute
	DefaultAdaptiveStart     = 10.0
	// A cut never takes the rate below this, across all instances: raven is still asked,
	// and its answers can raise the rate again.
	adaptiveFloor = 1.0
	// slowShare: the latency target is passed when more than this share of a period's
	// attempts took longer than it (its 90th percentile is above it).
	slowShare = 0.1
	// burstWindow: a share's token bucket holds this much of its rate, at least one
	// token, so that a loop woken a little late still sends at the rate.
	burstWindow = 50 * time.Millisecond
	// waitingEvery: how often the lanes waiting for the budget are counted while it binds.
	waitingEvery = 250 * time.Millisecond
)

// Adaptive configures adaptive mode: the rate to raven follows raven's own answers,
// additive increase and multiplicative decrease, never above Budget.MaxRate when set.
type Adaptive struct {
	Enabled bool
	// Threshold is the share of a period's attempts answered 429 or 503, or timed out,
	// above which the rate is cut. Defaults to 0.02.
	Threshold float64
	// LatencyTarget: the rate is cut when more than a tenth of a period's attempts took
	// longer than this. Defaults to a quarter of the send timeout.
	LatencyTarget time.Duration
	// Decrease is what a cut multiplies the rate by. Defaults to 0.85.
	Decrease float64
	// Increase is the step by which the rate rises after each good period, as a share of
	// the rate held before the last cuts. Defaults to 0.05.
	Increase float64
	// Start is the rate, across all instances, adaptive mode starts from; it doubles
	// after each good period until raven first refuses. Defaults to 10 a second.
	Start float64
	// Period is how often raven's answers are judged. Defaults to 1s.
	Period time.Duration
	// MaxPause caps how long a 503 with Retry-After pauses every send. Defaults to 5m.
	MaxPause time.Duration
}

// WithDefaults returns a with zero fields set to their defaults; sendTimeout sets the
// latency target's.
func (a Adaptive) WithDefaults(sendTimeout time.Duration) Adaptive {
	if a.Threshold == 0 {
		a.Threshold = DefaultAdaptiveThreshold
	}
	if a.LatencyTarget == 0 {
		a.LatencyTarget = sendTimeout / 4
	}
	if a.Decrease == 0 {
		a.Decrease = DefaultAdaptiveDecrease
	}
	if a.Increase == 0 {
		a.Increase = DefaultAdaptiveIncrease
	}
	if a.Period == 0 {
		a.Period = DefaultAdaptivePeriod
	}
	if a.Start == 0 {
		a.Start = DefaultAdaptiveStart
	}
	if a.MaxPause == 0 {
		a.MaxPause = DefaultAdaptiveMaxPause
	}
	return a
}

// Validate reports every field that cannot work.
func (a Adaptive) Validate() error {
	var errs []error
	if a.Threshold <= 0 || a.Threshold >= 1 {
		errs = append(errs, fmt.Errorf("adaptive threshold %v: must be above 0 and below 1", a.Threshold))
	}
	if a.Decrease <= 0 || a.Decrease >= 1 {
		errs = append(errs, fmt.Errorf("adaptive decrease %v: must be above 0 and below 1", a.Decrease))
	}
	if a.Increase <= 0 || a.Increase > 1 {
		errs = append(errs, fmt.Errorf("adaptive increase %v: must be above 0 and at most 1", a.Increase))
	}
	if a.Start < adaptiveFloor {
		errs = append(errs, fmt.Errorf("adaptive start %v: must be at least %v a second", a.Start, adaptiveFloor))
	}
	if a.LatencyTarget <= 0 || a.Period < 10*time.Millisecond || a.MaxPause <= 0 {
		errs = append(errs, fmt.Errorf("adaptive latency target %s, period %s, max pause %s: must be positive (the period at least 10ms)",
			a.LatencyTarget, a.Period, a.MaxPause))
	}
	return errors.Join(errs...)
}

// Why the rate an instance holds itself to last changed (BudgetState.Why starts with one;
// the label of dispatch_raven_rate_changes_total).
const (
	WhyBudget   = "budget"    // the budget was configured or steered
	WhyShare    = "share"     // the partitions this instance sends for changed
	WhyRefused  = "refused"   // adaptive: too many 429, 503 or timeouts
	WhySlow     = "slow"      // adaptive: attempts slower than the latency target
	WhyIncrease = "increase"  // adaptive: raven answered in time while the rate bound
	WhyPause    = "paused"    // raven answered 503 with Retry-After: every send waits
	WhyResumed  = "resumed"   // the pause is over
	whyStart    = "start"     // before any change
	WhyNoBudget = "no budget" // nothing limits this instance
)

// Whys are every WhyX a change of the rate is counted by (the label of
// dispatch_raven_rate_changes_total).
func Whys() []string {
	return []string{WhyBudget, WhyShare, WhyRefused, WhySlow, WhyIncrease, WhyPause, WhyResumed}
}

// BudgetState is one instance's view of raven's budget, for operators.
type BudgetState struct {
	// MaxRate and MaxInFlight are the budget in force for all instances together (0: no
	// limit); Steered says which of them an operator set (the others are configured).
	MaxRate     float64         `json:"maxRate"`
	MaxInFlight int             `json:"maxInFlight"`
	Steered     *request.Budget `json:"steered,omitempty"`
	Adaptive    bool            `json:"adaptive"`
	// Partitions this instance may send for now, of all.
	Owned      int `json:"owned"`
	Partitions int `json:"partitions"`
	// ShareRate and ShareInFlight are this instance's share of the budget (0: no limit).
	ShareRate     float64 `json:"shareRate"`
	ShareInFlight int     `json:"shareInFlight"`
	// AdaptiveRate is what adaptive mode allows all instances together, as this instance
	// judges raven's answers (0: not limiting).
	AdaptiveRate float64 `json:"adaptiveRate,omitempty"`
	// EffectiveRate is the rate this instance holds itself to now: the lower of its share
	// and its part of the adaptive rate (0: no limit).
	EffectiveRate float64 `json:"effectiveRate"`
	// Why and Changed say why and when the effective rate last changed.
	Why     string    `json:"why"`
	Changed time.Time `json:"changed,omitzero"`
	// PausedUntil: raven asked every sender to wait (503 with Retry-After) until then.
	PausedUntil time.Time `json:"pausedUntil,omitzero"`
	// Waiting is how many lanes were due but waiting for the budget, at the last count.
	Waiting  int `json:"waiting"`
	InFlight int `json:"inFlight"`
}

// Limited says whether anything limits this instance's sends to raven.
func (s BudgetState) Limited() bool {
	return s.MaxRate > 0 || s.MaxInFlight > 0 || s.Adaptive
}
