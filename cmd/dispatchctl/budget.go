package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/request"
)

func budget(ctx context.Context, e *env, _ []string) error {
	var view admin.BudgetView
	var err error
	if e.o.rate != "" || e.o.inflight != "" {
		view, err = e.svc.SetBudget(ctx, admin.BudgetChange{MaxRate: e.o.rate, MaxInFlight: e.o.inflight}, e.by)
	} else {
		view, err = e.svc.Budget(ctx)
	}
	if err != nil {
		return err
	}
	return e.print(view, func(w *tabwriter.Writer) { printBudget(w, view, time.Now()) })
}

// printBudget writes raven's budget and how each dispatcher holds it at now. A limit of
// 0 is written "no limit", never a 0 or "none" that would read as "nothing is sent".
func printBudget(w io.Writer, view admin.BudgetView, now time.Time) {
	if view.Steered == nil {
		fmt.Fprintf(w, "set by operators\tnothing: each dispatcher's RAVEN_MAX_RATE and RAVEN_MAX_INFLIGHT\n")
	} else {
		fmt.Fprintf(w, "set by operators\t%s (by %s at %s)\n", view.Steered.String(), printable(view.Steered.By), view.Steered.UpdatedAt.Format(time.RFC3339))
	}
	if view.Applied != nil && !*view.Applied {
		fmt.Fprintf(w, "not yet in force\ton every dispatcher after 2s: see below which still holds the old budget\n")
	}
	if len(view.Instances) == 0 {
		fmt.Fprintf(w, "dispatchers\tnone answered\n")
		return
	}
	share, effective := perSecond(view.ShareRate), perSecond(view.EffectiveRate)
	for _, in := range view.Instances {
		if in.MaxRate <= 0 && in.Owned > 0 {
			share = "no limit"
		}
	}
	if view.RateUnlimited() {
		effective = "no limit"
	}
	fmt.Fprintf(w, "total\tshares %s, effective %s, %s waiting for the budget\n", share, effective, admin.Count(view.Waiting, "lane", "lanes"))
	fmt.Fprintf(w, "\nINSTANCE\tBUDGET\tPARTITIONS\tSHARE\tEFFECTIVE\tIN FLIGHT\tWAITING\tWHY (LAST CHANGE)\n")
	for _, in := range view.Instances {
		b := "rate " + request.FormatRate(in.MaxRate) + ", in flight " + request.FormatInFlight(in.MaxInFlight)
		if in.MaxRate <= 0 && in.MaxInFlight <= 0 {
			b = "no limit"
		}
		if in.Adaptive {
			b += ", adaptive"
		}
		share := perSecond(in.ShareRate)
		switch {
		case in.MaxRate <= 0 && in.ShareInFlight > 0:
			share = fmt.Sprintf("no rate limit, %d in flight", in.ShareInFlight)
		case in.MaxRate <= 0:
			share = "no limit"
		case in.ShareInFlight > 0:
			share += fmt.Sprintf(", %d in flight", in.ShareInFlight)
		}
		effective := perSecond(in.EffectiveRate)
		switch {
		case in.RateUnlimited():
			effective = "no limit"
		case in.Owned == 0:
			effective = "0/s (no partition)"
		}
		why := in.Why
		if !in.Changed.IsZero() {
			why += fmt.Sprintf(" (%s ago)", admin.Age(now.Sub(in.Changed)))
		}
		if in.PausedUntil.After(now) {
			why = fmt.Sprintf("PAUSED for %s by raven; ", admin.Age(in.PausedUntil.Sub(now))) + why
		}
		fmt.Fprintf(w, "%s\t%s\t%d/%d\t%s\t%s\t%d\t%d\t%s\n", in.Instance, b, in.Owned, in.Partitions, share,
			effective, in.InFlight, in.Waiting, dash(printable(why)))
	}
}

// perSecond writes a rate that is not a limit: "0/s" for 0.
func perSecond(r float64) string {
	if r <= 0 {
		return "0/s"
	}
	return request.FormatRate(r)
}
