package console

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// Two instances' histories of a client that moved between them hold more gaps than the
// chart has room for: it draws the last ones inside its width, and counts every gap
// below the interval, drawn or not.
func TestTheGapChartDrawsTheLastGapsWithinItsWidth(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var history []introspect.Attempt
	for i := range 2 * dispatch.HistoryPerClient {
		gap := 6 * time.Second
		if i == 0 {
			gap = 4 * time.Second // the oldest, not drawn: still counted
		}
		history = append(history, introspect.Attempt{ID: fmt.Sprint(i), Start: t0.Add(time.Duration(i) * 6 * time.Second),
			HasGap: true, Gap: gap, Interval: 5 * time.Second, Outcome: schedule.OutcomeDelivered})
	}
	d := gapChart(history)
	if len(d.Bars) != dispatch.HistoryPerClient {
		t.Fatalf("%d bars, want the last %d", len(d.Bars), dispatch.HistoryPerClient)
	}
	for _, b := range d.Bars {
		if b.X < 0 || b.X+b.W > float64(d.Width) {
			t.Fatalf("a bar from %.0f to %.0f, outside the chart's width %d", b.X, b.X+b.W, d.Width)
		}
	}
	if d.Below != 1 {
		t.Fatalf("%d gaps below the interval counted, want the oldest one", d.Below)
	}
}

// The dead-letter filter reads a reason as the API does, and refuses one that is no
// reason rather than match nothing.
func TestTheDeadLetterFilterReadsAReasonAsTheAPIDoes(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]request.Reason{"attempts_exhausted": request.ReasonAttemptsExhausted, " age_exhausted ": request.ReasonAgeExhausted, "": ""} {
		if f, err := deadFilter(url.Values{"reason": {in}}); err != nil || f.Reason != want {
			t.Errorf("reason %q: %q, %v; want %q", in, f.Reason, err, want)
		}
	}
	for _, in := range []string{"tired", "attempts-exhausted"} {
		if _, err := deadFilter(url.Values{"reason": {in}}); err == nil || !strings.Contains(err.Error(), "attempts_exhausted") {
			t.Errorf("reason %s: %v, want an error that lists the reasons", in, err)
		}
	}
}
