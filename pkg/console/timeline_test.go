package console

import (
	"strings"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// The timeline writes an event's details after its type with separators between values
// only: a replayed event (no attempt, no status) read "replayed, reason ...", with a
// separator after nothing.
func TestTheTimelineSeparatesOnlyValues(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	events := []request.Event{
		{Type: request.EventReplayed, At: at, Reason: request.ReasonPermanent, Cycle: 1},
		{Type: request.EventAttemptFailed, At: at, Attempt: 2, Status: 503},
		{Type: request.EventDeadLettered, At: at, Attempt: 3, Reason: request.ReasonAttemptsExhausted, Error: "connection refused"},
		{Type: request.EventAccepted, At: at},
	}
	page := renderPage(t, "request", at, requestData{ID: "r1", Events: events})
	for _, want := range []string{
		"<strong>replayed</strong> — reason permanent (after replay 1)</li>",
		"<strong>attempt_failed</strong> — attempt 2, status 503</li>",
		"<strong>dead_lettered</strong> — attempt 3, reason attempts_exhausted: <span",
		"<strong>accepted</strong></li>",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the timeline does not say %q:\n%s", want, page[strings.Index(page, `id="timeline"`):])
		}
	}
}

// The latency chart's last bar counts the answers slower than the last bound: its
// title says "over 10s", not "up to >10s"; the others say "up to".
func TestTheLastLatencyBarIsOverTheLastBound(t *testing.T) {
	t.Parallel()
	latency := make([]int, len(introspect.LatencyBounds)+1)
	latency[0], latency[len(latency)-1] = 1, 2
	act := introspect.Activity{Latency: latency}
	page := renderPage(t, "overview", time.Now(), overviewData{Overview: admin.Overview{Activity: act}, Latency: latencyBars(act)})
	last := introspect.LatencyBounds[len(introspect.LatencyBounds)-1]
	for _, want := range []string{"<title>up to 1ms: 1</title>", "<title>over " + last.String() + ": 2</title>"} {
		if !strings.Contains(page, want) {
			t.Errorf("the latency chart does not say %q:\n%s", want, page)
		}
	}
	if strings.Contains(page, "up to &gt;") || strings.Contains(page, "up to >") {
		t.Errorf("the latency chart says \"up to >\":\n%s", page)
	}
}
