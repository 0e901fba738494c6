package main

import (
	"context"
	"fmt"
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
	return e.print(view, func(w *tabwriter.Writer) {
		if view.Steered == nil {
			fmt.Fprintf(w, "set by operators\tnothing: each dispatcher's RAVEN_MAX_RATE and RAVEN_MAX_INFLIGHT\n")
		} else {
			fmt.Fprintf(w, "set by operators\t%s (by %s at %s)\n", view.Steered, printable(view.Steered.By), view.Steered.UpdatedAt.Format(time.RFC3339))
		}
		if view.Applied != nil && !*view.Applied {
			fmt.Fprintf(w, "not yet in force\ton every dispatcher after 2s: see below which still holds the old budget\n")
		}
		if len(view.Instances) == 0 {
			fmt.Fprintf(w, "dispatchers\tnone answered\n")
			return
		}
		fmt.Fprintf(w, "total\tshares %s, effective %s, %d lanes waiting for the budget\n",
			request.FormatRate(view.ShareRate), request.FormatRate(view.EffectiveRate), view.Waiting)
		fmt.Fprintf(w, "\nINSTANCE\tBUDGET\tPARTITIONS\tSHARE\tEFFECTIVE\tIN FLIGHT\tWAITING\tWHY (LAST CHANGE)\n")
		for _, in := range view.Instances {
			b := "rate " + request.FormatRate(in.MaxRate) + ", in flight " + request.FormatInFlight(in.MaxInFlight)
			if in.Adaptive {
				b += ", adaptive"
			}
			share := request.FormatRate(in.ShareRate)
			if in.ShareInFlight > 0 {
				share += fmt.Sprintf(", %d in flight", in.ShareInFlight)
			}
			why := in.Why
			if !in.Changed.IsZero() {
				why += fmt.Sprintf(" (%s ago)", time.Since(in.Changed).Round(time.Second))
			}
			if in.PausedUntil.After(time.Now()) {
				why = fmt.Sprintf("PAUSED for %s by raven; ", time.Until(in.PausedUntil).Round(100*time.Millisecond)) + why
			}
			fmt.Fprintf(w, "%s\t%s\t%d/%d\t%s\t%s\t%d\t%d\t%s\n", in.Instance, b, in.Owned, in.Partitions, share,
				request.FormatRate(in.EffectiveRate), in.InFlight, in.Waiting, printable(why))
		}
	})
}
