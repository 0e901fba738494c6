package governor

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// Governor holds one instance to its share of raven's budget, and runs adaptive mode.
// Only the loop's goroutine touches it; operators read the state it publishes.
type Governor struct {
	configured Budget
	steered    request.Budget
	ad         Adaptive
	partitions int
	metrics    Metrics
	log        zerolog.Logger

	budget       Budget // in force
	owned        int    // partitions open to attempts, leases not lapsed
	countedUntil time.Time
	recount      bool

	rate          float64 // effective, per instance; 0: none
	tokens        bucket
	shareInFlight int // 0: none

	// adaptive mode
	adRate             float64   // across all instances; 0: not limiting
	slowStart          bool      // no cut yet: the rate doubles after each good period
	stepBase           float64   // the rate held before the streak of cuts: steps up are a share of it
	cutStreak          bool      // the last change was a cut
	ssthresh           float64   // below this (a cut of a rate raven took) the rate doubles back up
	cutAt              time.Time // attempts started before the last cut do not judge it
	winStart           time.Time
	winFirst, winLast  time.Time // the first attempt's start and the last one's end in the period
	winN, winBad, slow int
	winBound           bool // the rate held a lane back during the period
	pausedUntil        time.Time

	why       string
	changed   time.Time
	held      bool      // the last look held a lane back
	wake      time.Time // a token (or the end of a pause) is due then
	waiting   int
	countedAt time.Time
	state     atomic.Pointer[BudgetState]
}

// Metrics is what the Governor counts: how long a due lane waited for the budget, and
// each change of the rate it holds to, by why (a WhyX).
type Metrics interface {
	BudgetWait(time.Duration)
	RateChanged(why string)
}

// New returns a Governor for budget (shared by all instances) and adaptive mode (set to
// its defaults), over partitions partitions of which it owns none yet. m may be nil.
func New(budget Budget, ad Adaptive, partitions int, m Metrics, log zerolog.Logger) *Governor {
	if m == nil {
		m = noMetrics{}
	}
	g := &Governor{configured: budget, ad: ad, partitions: partitions, metrics: m, log: log,
		budget: budget, recount: true, why: whyStart}
	if g.ad.Enabled {
		// Nothing is known of raven yet: start low and double while it answers well, so
		// that a start with every lane due does not land on raven all at once.
		g.adRate, g.slowStart = g.ad.Start, true
		if g.budget.MaxRate > 0 {
			g.adRate = min(g.adRate, g.budget.MaxRate)
		}
	}
	g.publish()
	return g
}

// MayStart says whether another attempt may be handed out at now with inFlight attempts
// in flight. When it may not, wake says when to look again (zero: when an attempt ends).
func (g *Governor) MayStart(now time.Time, inFlight int) bool {
	g.wake, g.held = time.Time{}, true
	if now.Before(g.pausedUntil) {
		g.wake = g.pausedUntil
		return false
	}
	if !g.pausedUntil.IsZero() {
		g.pausedUntil = time.Time{}
		g.changedTo(now, WhyResumed, "raven's Retry-After is over")
	}
	if g.shareInFlight > 0 && inFlight >= g.shareInFlight {
		return false
	}
	if g.rate > 0 {
		ok, at := g.tokens.ready(now)
		if !ok {
			g.winBound = true
			g.wake = at
			return false
		}
	}
	g.held = false
	return true
}

// Look begins a look at the due lanes: until it holds one back, none is held.
func (g *Governor) Look() { g.held = false }

// PartitionsChanged says the partitions this instance may send for changed: its share
// is counted again at the next look.
func (g *Governor) PartitionsChanged() { g.recount = true }

// OverShare says whether inFlight attempts are more than this instance's share of raven's
// in-flight budget (false without one).
func (g *Governor) OverShare(inFlight int) bool {
	return g.budget.MaxInFlight > 0 && inFlight > g.shareInFlight
}

// LimitsInFlight says whether raven's budget bounds the attempts in flight.
func (g *Governor) LimitsInFlight() bool { return g.budget.MaxInFlight > 0 }

// HeldBack says whether the last look held a lane back, and until when (zero: until an
// attempt in flight ends).
func (g *Governor) HeldBack() (bool, time.Time) { return g.held, g.wake }

// limits says whether a budget or adaptive mode may hold lanes back.
func (g *Governor) limits() bool {
	return g.rate > 0 || g.budget.MaxInFlight > 0 || g.ad.Enabled
}

// Started takes a token for an attempt handed out at now, for a lane due at due, and
// says whether it did.
func (g *Governor) Started(now, due time.Time) (token bool) {
	if g.limits() {
		g.metrics.BudgetWait(now.Sub(due))
	}
	if g.rate > 0 {
		g.tokens.take()
		return true
	}
	return false
}

// Finished takes back a worker's result: a turn without an attempt gives back the token
// it took; an attempt's answer feeds adaptive mode.
func (g *Governor) Finished(r schedule.Result, token bool, now time.Time) {
	if r.AttemptEnd.IsZero() {
		if token && g.rate > 0 {
			g.tokens.refund()
		}
		return
	}
	if !g.ad.Enabled {
		return
	}
	if r.PauseAll > 0 {
		until := r.AttemptEnd.Add(min(r.PauseAll, g.ad.MaxPause))
		if until.After(g.pausedUntil) {
			if !now.Before(g.pausedUntil) {
				g.log.Warn().Dur("retry_after", r.PauseAll).Time("until", until).Msg("raven answered 503 with Retry-After: pausing every send to raven")
			}
			g.pausedUntil = until
			g.changedTo(now, WhyPause, fmt.Sprintf("raven answered 503 with Retry-After %s", r.PauseAll))
		}
	}
	if r.PauseAll > 0 {
		return // raven said how long to wait, and the pause does what a cut would
	}
	if r.AttemptEnd.Add(-r.Took).Before(g.cutAt) {
		return // sent at the rate before the last cut: says nothing of the new one
	}
	if start := r.AttemptEnd.Add(-r.Took); g.winN == 0 || start.Before(g.winFirst) {
		g.winFirst = start
	}
	g.winLast = schedule.Later(g.winLast, r.AttemptEnd)
	g.winN++
	if r.Refused {
		g.winBad++
	}
	if r.Took > g.ad.LatencyTarget {
		g.slow++
	}
	if g.winStart.IsZero() {
		g.winStart = now
	}
	if now.Sub(g.winStart) >= g.ad.Period {
		g.judge(now)
	}
}

// judge ends an adaptive period at now: a cut when raven refused or was slow, a step up
// when it answered well while the rate held lanes back.
func (g *Governor) judge(now time.Time) {
	n, bad, slow, bound := float64(g.winN), float64(g.winBad), float64(g.slow), g.winBound
	// Rates are over the time the period's attempts took place, not the whole period: a
	// burst (every lane due at once after a start) is judged at the rate it was sent at.
	span := max(g.winLast.Sub(g.winFirst), g.ad.Period/10).Seconds()
	period := max(now.Sub(g.winStart), g.ad.Period/10).Seconds()
	g.winStart, g.winN, g.winBad, g.slow, g.winBound, g.winLast = now, 0, 0, 0, false, time.Time{}
	if g.owned == 0 || n == 0 {
		return
	}
	toAll := float64(g.partitions) / float64(g.owned) // from this instance's rate to all instances'
	refused, slowed := bad/n > g.ad.Threshold, slow/n > slowShare
	switch {
	case refused || slowed:
		sent := n / span * toAll
		base := sent
		if g.adRate > 0 {
			base = min(g.adRate, sent)
		}
		// Down by the factor, and no higher than what raven took without refusing.
		cut := max(adaptiveFloor, min(base*g.ad.Decrease, (n-bad)/span*toAll))
		// Steps up are a share of the rate held before a streak of cuts, so that the rate
		// finds its way back in about 1/Increase periods after raven recovers, however
		// deep the streak went.
		if !g.slowStart && !g.cutStreak {
			g.ssthresh = g.ad.Decrease * g.adRate // a rate raven took before this streak
		}
		switch {
		case g.adRate == 0 || g.slowStart:
			// The first cut: the rate offered over the period (bursts included) is what
			// there is to find back.
			offered := n / period * toAll
			if g.adRate > 0 {
				offered = min(offered, g.adRate)
			}
			g.stepBase = max(cut, offered)
		case !g.cutStreak:
			g.stepBase = g.adRate
		default:
			g.stepBase = max(g.stepBase, g.adRate)
		}
		g.adRate, g.cutStreak, g.cutAt = cut, true, now
		if bad < n {
			// Raven took some: its capacity is near. A start with raven refusing
			// everything (down) learns nothing, and keeps doubling once it answers.
			g.slowStart = false
		}
		why := WhyRefused
		detail := fmt.Sprintf("%.0f%% of %d attempts refused (429, 503 or timed out), over %.0f%%", 100*bad/n, int(n), 100*g.ad.Threshold)
		if !refused {
			why = WhySlow
			detail = fmt.Sprintf("%.0f%% of %d attempts slower than %s", 100*slow/n, int(n), g.ad.LatencyTarget)
		}
		g.log.Debug().Float64("adaptive_rate", cut).Str("why", detail).Msg("raven rate cut")
		g.apply(now, why, detail)
	case g.adRate > 0 && bound:
		up := g.adRate + max(g.ad.Increase*g.stepBase, adaptiveFloor)
		switch {
		case g.slowStart:
			up = 2 * g.adRate
		case 2*g.adRate <= g.ssthresh:
			// Far below the rate held before the cuts (an outage drove it down):
			// double back towards it, then step.
			up = 2 * g.adRate
		}
		up = min(up, request.MaxBudgetRate)
		if g.budget.MaxRate > 0 {
			up = min(up, g.budget.MaxRate)
		}
		g.cutStreak = false
		if up != g.adRate {
			g.adRate = up
			g.apply(now, WhyIncrease, fmt.Sprintf("raven answered %d attempts in time", int(n)))
		}
	}
}

// Steer applies an operator's budget record.
func (g *Governor) Steer(b request.Budget, now time.Time) (was, is Budget) {
	was = g.budget
	g.steered = b
	g.budget = g.configured
	if b.MaxRate != nil {
		g.budget.MaxRate = *b.MaxRate
	}
	if b.MaxInFlight != nil {
		g.budget.MaxInFlight = *b.MaxInFlight
	}
	if g.budget.MaxRate > 0 && g.adRate > g.budget.MaxRate {
		g.adRate = g.budget.MaxRate
	}
	if g.budget != was {
		g.apply(now, WhyBudget, "raven's budget "+g.budget.Describe())
	}
	g.publish() // the record shown to operators, also when it steers as before
	return was, g.budget
}

// Describe says the budget in words, for logs and operators.
func (b Budget) Describe() string {
	return "rate " + request.FormatRate(b.MaxRate) + ", in flight " + request.FormatInFlight(b.MaxInFlight)
}

// Count sets how many partitions this instance may send for, open and with a lease not
// lapsed at now; until is when the first of those leases could lapse (zero: never).
func (g *Governor) Count(owned int, until, now time.Time) {
	g.countedUntil, g.recount = until, false
	if owned != g.owned {
		g.owned = owned
		g.apply(now, WhyShare, fmt.Sprintf("%d of %d partitions", owned, g.partitions))
	}
}

// NeedsCount says whether the partitions must be counted again at now.
func (g *Governor) NeedsCount(now time.Time) bool {
	return g.recount || !g.countedUntil.IsZero() && !now.Before(g.countedUntil)
}

// apply works out the share and the effective rate at now after a change, and records
// why when the effective limits changed.
func (g *Governor) apply(now time.Time, why, detail string) {
	frac := g.fraction()
	share, shareInFlight := g.budget.MaxRate*frac, 0
	if g.budget.MaxInFlight > 0 && g.owned > 0 {
		shareInFlight = int(math.Floor(float64(g.budget.MaxInFlight)*frac + 1e-9))
		if shareInFlight == 0 {
			// Its clients must not wait for ever: one attempt at a time, which can take
			// the sum over the budget by one (ADR 7).
			shareInFlight = 1
			g.log.Warn().Int("max_inflight", g.budget.MaxInFlight).Int("owned", g.owned).Int("partitions", g.partitions).
				Msg("raven's in-flight budget gives this instance less than one attempt; it takes one, so all instances together may go over the budget: raise RAVEN_MAX_INFLIGHT to at least partitions ÷ the fewest partitions an instance holds")
		}
	}
	rate := share
	if g.ad.Enabled && g.adRate > 0 {
		if r := g.adRate * frac; rate == 0 || r < rate {
			rate = r
		}
	}
	if rate > 0 && g.owned == 0 {
		rate = 0
	}
	if rate == g.rate && shareInFlight == g.shareInFlight && why != WhyPause && why != WhyResumed {
		g.publish()
		return
	}
	g.rate, g.shareInFlight = rate, shareInFlight
	if rate > 0 {
		g.tokens.set(rate, now)
	}
	g.changedTo(now, why, detail)
	g.publish()
}

// changedTo records why and when the limits changed.
func (g *Governor) changedTo(now time.Time, why, detail string) {
	g.why, g.changed = why+": "+detail, now
	g.metrics.RateChanged(why)
	g.publish()
}

func (g *Governor) fraction() float64 {
	if g.partitions == 0 {
		return 0
	}
	return float64(g.owned) / float64(g.partitions)
}

// CountWaiting records how many lanes are due but held back, at most every waitingEvery.
func (g *Governor) CountWaiting(now time.Time, count func() int) {
	if now.Sub(g.countedAt) < waitingEvery || g.waiting == 0 && !g.limits() {
		return
	}
	g.countedAt = now
	if n := count(); n != g.waiting {
		g.waiting = n
		g.publish()
	}
}

// Published is the state publish made last; safe from any goroutine.
func (g *Governor) Published() BudgetState { return *g.state.Load() }

// publish makes the state readable by operators.
func (g *Governor) publish() {
	share := g.budget.MaxRate * g.fraction()
	st := &BudgetState{MaxRate: g.budget.MaxRate, MaxInFlight: g.budget.MaxInFlight, Adaptive: g.ad.Enabled,
		Owned: g.owned, Partitions: g.partitions, ShareRate: share, ShareInFlight: g.shareInFlight,
		AdaptiveRate: g.adRate, EffectiveRate: g.rate, Why: g.why, Changed: g.changed, PausedUntil: g.pausedUntil, Waiting: g.waiting}
	if !g.steered.IsZero() {
		s := g.steered
		st.Steered = &s
	}
	if !st.Limited() && st.Why == whyStart {
		st.Why = WhyNoBudget
	}
	g.state.Store(st)
}

type noMetrics struct{}

func (noMetrics) BudgetWait(time.Duration) {}
func (noMetrics) RateChanged(string)       {}
