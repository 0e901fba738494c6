package request

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Budget is raven's send budget as operators set it in the control bucket, for every
// dispatcher instance at once. Each field, when set, replaces what the dispatchers were
// configured with (RAVEN_MAX_RATE, RAVEN_MAX_INFLIGHT); a field not set leaves the
// configured one in force. Zero means no limit.
type Budget struct {
	// MaxRate is attempts per second to raven, across all instances.
	MaxRate *float64 `json:"maxRate,omitempty"`
	// MaxInFlight is attempts in flight at once, across all instances.
	MaxInFlight *int `json:"maxInFlight,omitempty"`
	// UpdatedAt and By say when and by whom it was last changed, for operators.
	UpdatedAt time.Time `json:"updatedAt,omitzero"`
	By        string    `json:"by,omitempty"`
}

// IsZero says whether b overrides nothing.
func (b Budget) IsZero() bool { return b.MaxRate == nil && b.MaxInFlight == nil }

// Same says whether b and o set the same limits, whoever changed them when.
func (b Budget) Same(o Budget) bool {
	eqR := (b.MaxRate == nil) == (o.MaxRate == nil) && (b.MaxRate == nil || *b.MaxRate == *o.MaxRate)
	eqI := (b.MaxInFlight == nil) == (o.MaxInFlight == nil) && (b.MaxInFlight == nil || *b.MaxInFlight == *o.MaxInFlight)
	return eqR && eqI
}

// String says what b sets, for people: "rate 500/s, in flight configured".
func (b Budget) String() string {
	rate, inflight := "configured", "configured"
	if b.MaxRate != nil {
		rate = FormatRate(*b.MaxRate)
	}
	if b.MaxInFlight != nil {
		inflight = FormatInFlight(*b.MaxInFlight)
	}
	return "rate " + rate + ", in flight " + inflight
}

// FormatRate writes a budget rate for people: "500/s", or "no limit" for 0 (a limit of
// 0 limits nothing; "none" read as "nothing is sent").
func FormatRate(r float64) string {
	if r <= 0 {
		return "no limit"
	}
	return strconv.FormatFloat(r, 'f', -1, 64) + "/s"
}

// FormatInFlight writes an in-flight budget for people: "64", or "no limit" for 0.
func FormatInFlight(n int) string {
	if n <= 0 {
		return "no limit"
	}
	return strconv.Itoa(n)
}

// Validate reports a limit b sets that cannot work.
func (b Budget) Validate() error {
	r, n := 0.0, 0
	if b.MaxRate != nil {
		r = *b.MaxRate
	}
	if b.MaxInFlight != nil {
		n = *b.MaxInFlight
	}
	return ValidateBudget(r, n)
}

// ValidateBudget reports a rate or in-flight limit that cannot work.
func ValidateBudget(rate float64, inflight int) error {
	var errs []string
	if !(rate == 0 || rate >= MinBudgetRate && rate <= MaxBudgetRate) {
		errs = append(errs, fmt.Sprintf("max rate %v: must be 0 (no limit) or %v to %d attempts per second", rate, MinBudgetRate, MaxBudgetRate))
	}
	if inflight < 0 || inflight > MaxBudgetInFlight {
		errs = append(errs, fmt.Sprintf("max in flight %d: must be 0 (no limit) to %d", inflight, MaxBudgetInFlight))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// The budgets accepted: the largest far above what one raven takes, small enough to
// compute with; the least rate one attempt a minute.
const (
	MinBudgetRate     = 1.0 / 60
	MaxBudgetRate     = 1_000_000
	MaxBudgetInFlight = 1_000_000
)
