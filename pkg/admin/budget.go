package admin

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/penguinhq/dispatcher/pkg/governor"
	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// BudgetView is raven's budget: as operators set it, and as each dispatcher instance
// that answered holds it.
type BudgetView struct {
	// Steered is what operators set; nil when nothing is: each instance's configured
	// RAVEN_MAX_RATE and RAVEN_MAX_INFLIGHT are in force.
	Steered   *request.Budget  `json:"steered,omitempty"`
	Instances []InstanceBudget `json:"instances"`
	// The instances' figures added up: their shares never add up to more than the budget.
	ShareRate     float64 `json:"shareRate"`
	EffectiveRate float64 `json:"effectiveRate"`
	Waiting       int     `json:"waiting"`
	// Applied says, after a change, whether every instance that answered has it in force.
	Applied *bool `json:"applied,omitempty"`
}

// InstanceBudget is one dispatcher instance's view of raven's budget.
type InstanceBudget struct {
	Instance string `json:"instance"`
	governor.BudgetState
}

// Budget reads raven's budget, and asks every dispatcher how it holds it.
func (s *Service) Budget(ctx context.Context) (BudgetView, error) {
	return s.budgetOf(ctx, ask[introspect.BudgetAnswer](ctx, s, introspect.BudgetQuestion{}))
}

// budgetOf is the budget as operators set it, and as the dispatchers answered.
func (s *Service) budgetOf(ctx context.Context, answers []introspect.BudgetAnswer) (BudgetView, error) {
	b, err := s.ctl.Budget(ctx)
	if err != nil {
		return BudgetView{}, err
	}
	out := BudgetView{Instances: []InstanceBudget{}}
	if !b.IsZero() {
		out.Steered = &b
	}
	for _, a := range answers {
		if a.Budget == nil {
			continue
		}
		out.Instances = append(out.Instances, InstanceBudget{Instance: a.Instance, BudgetState: *a.Budget})
		out.ShareRate += a.Budget.ShareRate
		out.EffectiveRate += a.Budget.EffectiveRate
		out.Waiting += a.Budget.Waiting
	}
	slices.SortFunc(out.Instances, func(a, b InstanceBudget) int { return strings.Compare(a.Instance, b.Instance) })
	return out, nil
}

// BudgetChange is an operator's change of raven's budget. Each field is a number (0 or
// "none" for no limit), "configured" to go back to the dispatchers' own setting, or empty
// to leave it as it is.
type BudgetChange struct {
	MaxRate     string
	MaxInFlight string
}

// Configured is what an operator writes to go back to the dispatchers' configured budget.
const Configured = "configured"

// ParseBudgetChange reads the fields of a change, as BudgetChange describes them.
func ParseBudgetChange(c BudgetChange) (func(*request.Budget), error) {
	if c.MaxRate == "" && c.MaxInFlight == "" {
		return nil, invalid("give a max rate or a max in flight (a number, 0 for no limit, or %q)", Configured)
	}
	var setRate, setInFlight func(*request.Budget)
	switch v := strings.TrimSpace(c.MaxRate); v {
	case "":
	case "none":
		setRate = func(b *request.Budget) { zero := 0.0; b.MaxRate = &zero }
	case Configured, "default":
		setRate = func(b *request.Budget) { b.MaxRate = nil }
	default:
		r, err := strconv.ParseFloat(strings.TrimSuffix(v, "/s"), 64)
		if err != nil || request.ValidateBudget(r, 0) != nil {
			return nil, invalid("max rate %q: attempts per second, 0 (no limit) or %.4g to %d, or %q", v, request.MinBudgetRate, request.MaxBudgetRate, Configured)
		}
		setRate = func(b *request.Budget) { b.MaxRate = &r }
	}
	switch v := strings.TrimSpace(c.MaxInFlight); v {
	case "":
	case "none":
		setInFlight = func(b *request.Budget) { zero := 0; b.MaxInFlight = &zero }
	case Configured, "default":
		setInFlight = func(b *request.Budget) { b.MaxInFlight = nil }
	default:
		n, err := strconv.Atoi(v)
		if err != nil || request.ValidateBudget(0, n) != nil {
			return nil, invalid("max in flight %q: a whole number from 0 (no limit) to %d, or %q", v, request.MaxBudgetInFlight, Configured)
		}
		setInFlight = func(b *request.Budget) { b.MaxInFlight = &n }
	}
	return func(b *request.Budget) {
		if setRate != nil {
			setRate(b)
		}
		if setInFlight != nil {
			setInFlight(b)
		}
	}, nil
}

// budgetApplyWait is how long SetBudget waits for the dispatchers to show a change.
const budgetApplyWait = 2 * time.Second

// SetBudget changes raven's budget for every dispatcher, then reads it back, waiting up
// to two seconds for every instance that answers to have it in force.
func (s *Service) SetBudget(ctx context.Context, c BudgetChange, by string) (BudgetView, error) {
	change, err := ParseBudgetChange(c)
	if err != nil {
		return BudgetView{}, err
	}
	was, err := s.ctl.Budget(ctx)
	if err != nil {
		return BudgetView{}, err
	}
	now, err := s.ctl.UpdateBudget(ctx, by, change)
	if err != nil {
		return BudgetView{}, err
	}
	if !now.Same(was) {
		s.log.Info().Str("was", was.String()).Str("now", now.String()).Str("by", by).Msg("raven's budget set")
	}
	deadline := time.Now().Add(budgetApplyWait)
	for {
		view, err := s.Budget(ctx)
		if err != nil {
			return view, err
		}
		applied := true
		for _, in := range view.Instances {
			if now.MaxRate != nil && in.MaxRate != *now.MaxRate || now.MaxInFlight != nil && in.MaxInFlight != *now.MaxInFlight {
				applied = false
			}
		}
		if applied || time.Now().After(deadline) || ctx.Err() != nil {
			view.Applied = &applied
			return view, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}
