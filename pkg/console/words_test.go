package console

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/governor"
	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// renderPage executes page name's template with data, as Console.render does.
func renderPage(t *testing.T, name string, now time.Time, data any) string {
	t.Helper()
	pages, err := parsePages()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := pages[name].ExecuteTemplate(&buf, "layout", view{Title: name, Now: now, Data: data}); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// A budget of 0 is no limit: the budget table says "no limit" where the rate is not
// limited, never an effective rate of 0, which reads as "nothing is sent".
func TestTheBudgetSaysNoLimitRatherThanZero(t *testing.T) {
	t.Parallel()
	zero := 0.0
	bv := &admin.BudgetView{
		Steered: &request.Budget{MaxRate: &zero, By: "ops"},
		Instances: []admin.InstanceBudget{
			{Instance: "free", BudgetState: governor.BudgetState{Owned: 4, Partitions: 8}},
			{Instance: "idle", BudgetState: governor.BudgetState{MaxRate: 100, Owned: 0, Partitions: 8}},
		},
	}
	page := renderPage(t, "overview", time.Now(), overviewData{Overview: admin.Overview{Budget: bv}})
	for _, want := range []string{
		`<td>free</td><td class="num">no limit</td><td class="num">no limit</td><td class="num">no limit</td>`,
		`<td>idle</td><td class="num">100.00/s</td><td class="num">0/s</td><td class="num">0/s (no partition)</td>`,
		"Effective rate, all instances: no limit;",
		": rate no limit, in flight as configured.",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the overview's budget does not say %q:\n%s", want, page[strings.Index(page, `id="h-budget"`):])
		}
	}
}

// Each instance's row on the overview counts its deliveries and its failures (transient
// and permanent together) from its last minute.
func TestTheOverviewCountsEachInstancesOutcomes(t *testing.T) {
	t.Parallel()
	act := introspect.Activity{Outcomes: map[schedule.Outcome]int{schedule.OutcomeDelivered: 7, schedule.OutcomeTransient: 2, schedule.OutcomePermanent: 1}, Lanes: 3, InFlight: 1, Owned: 4}
	o := admin.Overview{Instances: []admin.InstanceActivity{{Instance: "d1", Activity: act}}}
	page := renderPage(t, "overview", time.Now(), overviewData{Overview: o})
	if want := `<td>d1</td><td class="num">3</td><td class="num">1</td><td class="num">4</td><td class="num">7</td><td class="num">3</td>`; !strings.Contains(page, want) {
		t.Errorf("the overview's instances do not say %q:\n%s", want, page)
	}
}

// Ages are rounded as a person reads them, not to the millisecond.
func TestAgesReadAsAPersonReadsThem(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	ago := funcs["ago"].(func(now, t time.Time) string)
	until := funcs["until"].(func(now, t time.Time) string)
	for d, want := range map[time.Duration]string{
		60975 * time.Millisecond: "1m1s ago", 59294 * time.Millisecond: "59s ago", 3240 * time.Millisecond: "3.2s ago",
		2*time.Hour + 5*time.Minute + 10*time.Second: "2h5m ago",
	} {
		if got := ago(now, now.Add(-d)); got != want {
			t.Errorf("ago %s: %q, want %q", d, got, want)
		}
	}
	if got := until(now, now.Add(59294*time.Millisecond)); got != "in 59s" {
		t.Errorf("until 59.294s: %q, want \"in 59s\"", got)
	}
}

// One attempt is "1 attempt".
func TestOneIsSingular(t *testing.T) {
	t.Parallel()
	dl := &request.DeadLetter{Verdict: request.Verdict{Reason: request.ReasonPermanent, Attempts: 1}}
	page := renderPage(t, "request", time.Now(), requestData{ID: "r1", State: &admin.RequestState{ID: "r1", State: "dead_lettered", DeadLetter: dl}})
	if !strings.Contains(page, "after 1 attempt</dd>") {
		t.Errorf("a dead letter after one attempt does not say \"after 1 attempt\":\n%s", page)
	}
	if got := flashText(map[string][]string{"flash": {"purged"}, "n": {"1"}}); !strings.Contains(got, "Purged: 1 request moved") {
		t.Errorf("a purge of one request says %q, want \"Purged: 1 request moved ...\"", got)
	}
}

// The request page shows raven's answer from the record: status, kept headers, and the
// body as text, escaped; a binary body says it is base64.
func TestRequestPageShowsRavensAnswer(t *testing.T) {
	t.Parallel()
	text := request.NewResponse(201, http.Header{"Content-Type": {"text/html"}}, []string{"Content-Type"}, []byte(`<b>ok</b>`), false)
	page := renderPage(t, "request", time.Now(), requestData{ID: "r1", State: &admin.RequestState{ID: "r1", State: "delivered",
		Record: &request.Status{ID: "r1", State: request.StateDelivered, Response: text}}})
	if !strings.Contains(page, "status 201, Content-Type: text/html") || !strings.Contains(page, `<pre class="answer">&lt;b&gt;ok&lt;/b&gt;</pre>`) {
		t.Errorf("the delivered request's page does not show raven's answer escaped:\n%s", page)
	}
	bin := request.NewResponse(200, nil, nil, []byte{0xff, 0xfe}, true)
	page = renderPage(t, "request", time.Now(), requestData{ID: "r1", State: &admin.RequestState{ID: "r1", State: "delivered",
		Record: &request.Status{ID: "r1", State: request.StateDelivered, Response: bin}}})
	if !strings.Contains(page, "2 bytes that are not text, as base64") || !strings.Contains(page, "(body cut at 2 bytes)") || !strings.Contains(page, "//4=") {
		t.Errorf("a binary answer's page:\n%s", page)
	}
}
