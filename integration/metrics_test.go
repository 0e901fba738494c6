package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/penguinhq/dispatcher/integration/itest"
	"github.com/penguinhq/dispatcher/pkg/ledger"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// scrape reads a Prometheus text exposition into "name{labels}" -> value.
func scrape(t testing.TB, url string) map[string]float64 {
	t.Helper()
	m, err := readMetrics(url)
	if err != nil {
		t.Fatalf("scraping %s: %v", url, err)
	}
	return m
}

// scrapeQuiet is scrape for polling: an empty map when the scrape fails.
// gather reads an in-process registry as scrape reads a /metrics page.
func gather(t testing.TB, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	m, err := parseMetrics(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func metric(t testing.TB, m map[string]float64, key string) float64 {
	t.Helper()
	v, ok := m[key]
	if !ok {
		t.Fatalf("metric %s is missing", key)
	}
	return v
}

// adminCall makes one admin API call and returns the status and decoded body.
func adminCall(t testing.TB, method, url, token, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := testHTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: %d with a body that is not JSON: %q", method, url, resp.StatusCode, raw)
	}
	return resp.StatusCode, out
}

// The binaries count what they do, and the counts match what the recording raven saw:
// deliveries, transient and permanent failures, dead letters, ingest outcomes. The
// admin API needs its token; both binaries report ready, and stop cleanly on SIGTERM.
func TestMetricsMatchTheRecordingRaven(t *testing.T) {
	t.Parallel()
	const interval = 150 * time.Millisecond
	var arrivals atomic.Int64
	s := newStack(t, options{interval: interval, noStart: true, respond: func(a ledger.Arrival) ledger.Response {
		n := arrivals.Add(1)
		switch {
		case a.ClientID == "doomed":
			return ledger.Response{Status: 422} // permanent
		case n%4 == 0:
			return ledger.Response{Status: 503} // transient, retried
		}
		return ledger.Response{}
	}})
	ingestAddr, ingestOps, dispOps := freeAddr(t), freeAddr(t), freeAddr(t)
	const token = "s3cret-admin-token-0123456789abcdef"
	ing := startBin(t, ingestBin, map[string]string{"NATS_URL": s.srv.ClientURL(), "INGEST_ADDR": ingestAddr, "OPS_ADDR": ingestOps})
	disp := startProc(t, map[string]string{"NATS_URL": s.srv.ClientURL(), "RAVEN_URL": s.ravenURL, "DISPATCH_INTERVAL": interval.String(),
		// A send timeout no prompt answer outlasts on a loaded machine: one that did would
		// count a transient failure raven never gave.
		"LEASE_TTL": "4s", "RAVEN_TIMEOUT": "3s", "OPS_ADDR": dispOps, "ADMIN_TOKEN": token, "INSTANCE_ID": "metrics-test"})
	waitReady(t, "http://"+ingestAddr)
	waitReady(t, "http://"+ingestOps)
	waitReady(t, "http://"+dispOps)
	s.ingestURL = "http://" + ingestAddr + "/v1/requests"
	// Started on default settings, the binaries agree with each other and say nothing
	// alarming: the only warning is ingest's that it is open to anyone (no token set).
	// The dispatcher sums its partitions up in one line.
	acquired := func() (sum float64, lines int) {
		got := logLines(disp.Output(), "partitions acquired")
		for _, l := range got {
			n, _ := l["acquired"].(float64)
			sum += n
		}
		return sum, len(got)
	}
	waitFor(t, time.Minute, "the dispatcher to log its 64 partitions", func() bool { sum, _ := acquired(); return sum >= 64 })
	// A warning of a slow store (a heartbeat or a listing that ran out of time) is the
	// machine's, not the defaults': seen with two CI runs side by side.
	for name, out := range map[string]string{"ingest": ing.Output(), "dispatcher": disp.Output()} {
		for _, l := range logLines(out, "") {
			slow := strings.Contains(fmt.Sprint(l["error"]), "context deadline exceeded")
			if l["level"] == "warn" && !slow && !strings.HasPrefix(l["message"].(string), "ingest accepts requests from anyone") {
				t.Errorf("%s warned on a default start: %v", name, l)
			}
		}
	}
	// One line as a rule; a loaded machine's store may time out an acquisition, which the
	// next round then logs in a line of its own: a few lines, never a line a partition.
	if sum, lines := acquired(); sum != 64 || lines > 4 {
		t.Errorf("the dispatcher logged its partitions as %v, want 64 in one line (a few on a loaded machine)", logLines(disp.Output(), "partitions acquired"))
	}

	for c := range 4 {
		for n := range 5 {
			s.post(clientName(c), n)
		}
	}
	s.post("doomed", 0)
	if a := s.postRaw(jsonHeader(), []byte(`{"clientId": 42}`)); a.Status != 400 {
		t.Fatalf("bad request: %d", a.Status)
	}
	dup := http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {"k-1"}}
	s.postRaw(dup, []byte(`{"clientId":"client-000","n":"again"}`))
	s.postRaw(dup, []byte(`{"clientId":"client-000","n":"again"}`))

	s.waitDone(2 * time.Minute)
	// The counters move right after raven answers; give the last one a moment.
	var delivered, transient, permanent int
	for _, a := range s.ledger.Arrivals() {
		switch {
		case a.Status < 300:
			delivered++
		case a.Status == 503:
			transient++
		default:
			permanent++
		}
	}
	var m map[string]float64
	// The queue's gauges are read from NATS at the scrape, within a bound: a scrape that
	// a loaded server answered late lacks them, and is read again.
	// A loaded machine may also have let the dispatcher's leases lapse for a moment
	// (heartbeats timing out): it holds all 64 again before the gauges are compared.
	waitForState(t, time.Minute, "the delivered counter to catch up, and the queue's gauges", func() (bool, string) {
		m = scrape(t, "http://"+dispOps+"/metrics")
		up, owned, proven := m[`dispatch_queue_up`], m[`dispatch_partitions_owned`], m[`dispatch_queue_link_proven`]
		return m[`dispatch_attempts_total{outcome="delivered"}`] == float64(delivered) && up == 1 && owned == 64 && proven == 1,
			fmt.Sprintf("delivered counter %v of %d, dispatch_queue_up %v, partitions owned %v, dispatch_queue_link_proven %v (0: the binary reads heads without proving its link, or proves none)",
				m[`dispatch_attempts_total{outcome="delivered"}`], delivered, up, owned, proven)
	})
	checks := []struct {
		key  string
		want float64
	}{
		{`dispatch_attempts_total{outcome="transient_failure"}`, float64(transient)},
		{`dispatch_attempts_total{outcome="permanent_failure"}`, float64(permanent)},
		{`dispatch_dead_letters_total{reason="permanent"}`, 1},
		{`dispatch_attempt_duration_seconds_count`, float64(len(s.ledger.Arrivals()))},
		{`dispatch_queue_requests`, 0},
		{`dispatch_dead_letter_requests`, 1},
		{`dispatch_partitions_owned`, 64},
		{`dispatch_queue_up`, 1},
		{`dispatch_queue_link_proven`, 1},
	}
	for _, c := range checks {
		if got := metric(t, m, c.key); got != c.want {
			t.Errorf("%s = %v, want %v (the recording raven saw %d arrivals)", c.key, got, c.want, len(s.ledger.Arrivals()))
		}
	}
	if delivered != 21 || transient == 0 || permanent != 1 {
		t.Fatalf("raven saw %d delivered, %d transient, %d permanent; the test needs 21, some, 1", delivered, transient, permanent)
	}
	// No send kept a gap under the interval: the ratio's buckets under 1 are empty, and
	// the counter an alert watches is 0.
	if n := metric(t, m, `dispatch_send_gap_ratio_bucket{le="0.99"}`); n != 0 {
		t.Errorf("%v sends kept a gap under 0.99 of the interval", n)
	}
	if n := metric(t, m, `dispatch_send_gaps_below_interval_total`); n != 0 {
		t.Errorf("dispatch_send_gaps_below_interval_total = %v, want 0", n)
	}
	if n := metric(t, m, `dispatch_send_gap_seconds_count`); n == 0 || n != metric(t, m, `dispatch_send_gap_ratio_count`) {
		t.Errorf("%v gaps observed in seconds, %v as ratios: want some, the same", n, m[`dispatch_send_gap_ratio_count`])
	}
	// Every reason's counter is there from the start, at zero where nothing happened.
	for _, r := range request.Reasons {
		metric(t, m, `dispatch_dead_letters_total{reason="`+string(r)+`"}`)
	}

	im := scrape(t, "http://"+ingestOps+"/metrics")
	for key, want := range map[string]float64{
		`dispatch_ingest_requests_total{outcome="accepted"}`:          22, // 20 + doomed + the first keyed one
		`dispatch_ingest_requests_total{outcome="duplicate"}`:         1,
		`dispatch_ingest_requests_total{outcome="client_id_invalid"}`: 1,
		`dispatch_ingest_publish_duration_seconds_count`:              23,
	} {
		if got := metric(t, im, key); got != want {
			t.Errorf("ingest %s = %v, want %v", key, got, want)
		}
	}
	for k := range im {
		if strings.Contains(k, "client-0") || strings.Contains(k, "doomed") {
			t.Errorf("metric %s carries a clientId", k)
		}
	}

	// The dashboard and the alert rules name only what the two binaries serve.
	both := servedBy(m, im)
	checkPromQL(t, both, dashboardExprs(t))
	checkPromQL(t, both, ruleExprs(t))
	for _, name := range []string{"dispatch_ready", "dispatch_partitions"} {
		if _, ok := both[name]; !ok {
			t.Errorf("%s is not served", name)
		}
	}
	// dispatch_ready says what /readyz says, read at the same time: a loaded machine may
	// stall NATS past readiness's bound at any one moment, so they are read together
	// until both say ready, and a gauge stuck at 0 while /readyz answers 200 fails.
	itest.WaitForState(t, time.Minute, "dispatch_ready = 1 with /readyz answering 200", func() (bool, string) {
		gauge := scrape(t, "http://"+dispOps+"/metrics")["dispatch_ready"]
		code := status("http://" + dispOps + "/readyz")
		return gauge == 1 && code == http.StatusOK, fmt.Sprintf("dispatch_ready %v, /readyz %d", gauge, code)
	})
	if got := metric(t, m, "dispatch_partitions"); got != 64 {
		t.Errorf("dispatch_partitions = %v, want 64", got)
	}

	// The admin API: its own token, problem+json without it.
	base := "http://" + dispOps + "/admin/v1"
	if code, body := adminCall(t, "GET", base+"/clients", "", ""); code != 401 || body["code"] != "unauthorized" {
		t.Fatalf("admin API without a token: %d %v", code, body)
	}
	if code, _ := adminCall(t, "GET", base+"/clients", "wrong", ""); code != 401 {
		t.Fatalf("admin API with a wrong token: %d", code)
	}
	code, body := adminCall(t, "POST", base+"/replay", token, `{"all":true,"dryRun":true}`)
	if rep, _ := body["report"].(map[string]any); code != 200 || rep["matched"] != 1.0 {
		t.Fatalf("admin dry-run replay: %d %v", code, body)
	}
	if code, body := adminCall(t, "POST", base+"/replay", token, `{}`); code != 400 || !strings.Contains(body["detail"].(string), "all") {
		t.Fatalf("admin replay without a filter: %d %v", code, body)
	}
	if code, body := adminCall(t, "PUT", base+"/interval", token, `{"interval":"2s"}`); code != 200 || body["globalInterval"] != "2s" {
		t.Fatalf("admin set interval: %d %v", code, body)
	}
	if code, _ := adminCall(t, "GET", "http://"+ingestOps+"/admin/v1/clients", token, ""); code != 404 {
		t.Fatalf("ingest serves an admin API: %d", code)
	}

	for _, p := range []*proc{disp, ing} {
		p.signal(syscall.SIGTERM)
		if code := p.ExitCode(); code != 0 {
			t.Fatalf("exit %d on SIGTERM, want 0:\n%s", code, p.Output())
		}
		if !bytes.Contains([]byte(p.Output()), []byte("stopped")) && p == ing {
			t.Fatalf("ingest did not log its stop:\n%s", p.Output())
		}
	}
}
