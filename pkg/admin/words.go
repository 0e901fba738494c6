package admin

import (
	"fmt"
	"time"
)

// How the operators' tools (dispatchctl, the console) write figures for people: ages a
// person reads at a glance, counts with the noun in the right number, budgets that say
// "no limit" rather than a 0 that reads as "nothing is sent".

// Age writes d for a person reading how long ago (or how soon) something is: to the
// tenth of a second below 10 s ("3.2s"), to the second below an hour ("59s", "1m1s"),
// to the minute above ("2h5m"). It is a Go duration all the same (time.ParseDuration
// reads it). Gaps judged against an interval keep their milliseconds: they are not ages.
func Age(d time.Duration) string {
	sign := ""
	if d <= -50*time.Millisecond { // what rounds to 0 is "0s", without a sign
		sign, d = "-", -d
	}
	switch {
	case d < 10*time.Second:
		return sign + d.Round(100*time.Millisecond).String()
	case d < time.Hour-time.Second/2:
		return sign + d.Round(time.Second).String()
	}
	d = d.Round(time.Minute)
	h, m := d/time.Hour, d%time.Hour/time.Minute
	if m == 0 {
		return fmt.Sprintf("%s%dh", sign, h)
	}
	return fmt.Sprintf("%s%dh%dm", sign, h, m)
}

// Count writes n with its noun in the right number: "1 attempt", "2 attempts",
// "0 attempts".
func Count[N ~int | ~int64 | ~uint64](n N, one, many string) string {
	noun := many
	if n == 1 {
		noun = one
	}
	return fmt.Sprintf("%d %s", n, noun)
}

// RateUnlimited says whether this instance holds itself to no rate: it owns partitions
// and nothing (budget, adaptive mode) limits its rate. An instance that owns none has an
// effective rate of 0 too, but it sends nothing at all.
func (b InstanceBudget) RateUnlimited() bool { return b.Owned > 0 && b.EffectiveRate <= 0 }

// RateUnlimited says whether some instance that answered holds itself to no rate: the
// instances' effective rates then add up to no limit, whatever the others hold.
func (v BudgetView) RateUnlimited() bool {
	for _, in := range v.Instances {
		if in.RateUnlimited() {
			return true
		}
	}
	return false
}
