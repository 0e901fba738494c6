package openapi_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/httpapi"
	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/openapi"
	"github.com/penguinhq/dispatcher/pkg/openapi/openapitest"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// publisher stores nothing: it answers with err, or a receipt.
type publisher struct {
	err       error
	duplicate bool
}

func (p publisher) Publish(context.Context, request.Request) (request.Receipt, error) {
	if p.err != nil {
		return request.Receipt{}, p.err
	}
	return request.Receipt{Seq: 1, Duplicate: p.duplicate}, nil
}

func (p publisher) PublishAll(ctx context.Context, rs []request.Request) ([]request.Receipt, []error) {
	receipts, errs := make([]request.Receipt, len(rs)), make([]error, len(rs))
	for i, r := range rs {
		receipts[i], errs[i] = p.Publish(ctx, r)
	}
	return receipts, errs
}

type readiness struct{ err error }

// statuses answers status reads from events kept by request id; an id without events
// is unknown, and the id failing fails.
type statuses struct {
	events  map[string][]request.Event
	failing string
}

func (s statuses) StatusEvents(_ context.Context, _, id string) ([]request.Event, error) {
	if id == s.failing {
		return nil, errors.New("no leader")
	}
	return s.events[id], nil
}

func (s statuses) Place(_ context.Context, st request.Status) *request.QueuePlace {
	if st.State != request.StateQueued {
		return nil
	}
	return &request.QueuePlace{Backlog: 3, AtHead: true}
}

func (s statuses) WatchEvents(_, _ string, _ func(request.Event)) (func(), error) {
	return func() {}, nil
}

func (s statuses) AskQueued(context.Context, string, string) (request.Found, bool, error) {
	return request.Found{}, false, nil
}

func (r readiness) Ready(context.Context) error { return r.err }

// exchange is one call and the status it must get.
type exchange struct {
	name, method, path, body string
	header                   map[string]string
	want                     int
}

// run makes each exchange with client against base, failing on a status other than
// the one wanted; client's Checker does the rest.
func run(t *testing.T, client *http.Client, base string, exchanges []exchange) {
	t.Helper()
	for _, x := range exchanges {
		var body io.Reader
		if x.body != "" {
			body = strings.NewReader(x.body)
		}
		req, err := http.NewRequest(x.method, base+x.path, body)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range x.header {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", x.name, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != x.want {
			t.Errorf("%s: %s %s answered %d %s, want %d", x.name, x.method, x.path, resp.StatusCode, b, x.want)
		}
	}
}

func get(t *testing.T, client *http.Client, url, ifNoneMatch string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ifNoneMatch != "" {
		req.Header.Set("If-None-Match", ifNoneMatch)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{resp, b}
}

// serveIngest serves the real ingest API with pub and ready, and returns its URL and a
// client that holds every exchange to the ingest document.
func serveIngest(t *testing.T, cfg ingest.Config, pub ingest.Publisher, ready ingest.Readiness) (string, *http.Client) {
	t.Helper()
	api, err := ingest.New(cfg, pub, ready, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	return srv.URL, &http.Client{Transport: openapitest.NewChecker(t, openapi.Ingest()).Transport(t, nil)}
}

// TestIngestExchanges holds the ingest API's answers, each kind of them, to the document.
func TestIngestExchanges(t *testing.T) {
	t.Parallel()
	const (
		post = http.MethodPost
		path = "/v1/requests"
	)
	jsonCT := map[string]string{"Content-Type": "application/json", "X-Client-Id": "penguin-7"}
	t.Run("OK", func(t *testing.T) {
		t.Parallel()
		url, client := serveIngest(t, ingest.Config{MaxBodyBytes: 64}, publisher{}, readiness{})
		run(t, client, url, []exchange{
			{"header clientId", post, path, `{"a":1}`, jsonCT, 202},
			{"body clientId", post, path, `{"clientId":"penguin-7","a":[1,2]}`, map[string]string{"Content-Type": "application/cloudevents+json"}, 202},
			{"idempotency key", post, path, `[1]`, map[string]string{"Content-Type": "application/json", "X-Client-Id": "p", "Idempotency-Key": "order-1"}, 202},
			{"malformed", post, path, `{"a":`, jsonCT, 400},
			{"no clientId", post, path, `{"a":1}`, map[string]string{"Content-Type": "application/json"}, 400},
			{"clientId not a string", post, path, `{"clientId":7}`, map[string]string{"Content-Type": "application/json"}, 400},
			{"idempotency key invalid", post, path, `{}`, map[string]string{"Content-Type": "application/json", "X-Client-Id": "p", "Idempotency-Key": "é"}, 400},
			{"not JSON", post, path, `a=1`, map[string]string{"Content-Type": "application/x-www-form-urlencoded", "X-Client-Id": "p"}, 415},
			{"too large", post, path, `{"a":"` + strings.Repeat("x", 100) + `"}`, jsonCT, 413},
			{"not before delay", post, path, `{}`, map[string]string{"Content-Type": "application/json", "X-Client-Id": "p", "Not-Before": "90"}, 202},
			{"not before time", post, path, `{}`, map[string]string{"Content-Type": "application/json", "X-Client-Id": "p", "Not-Before": time.Now().Add(time.Hour).Format(time.RFC3339)}, 202},
			{"not before too far", post, path, `{}`, map[string]string{"Content-Type": "application/json", "X-Client-Id": "p", "Not-Before": "99999999"}, 400},
			{"not before invalid", post, path, `{}`, map[string]string{"Content-Type": "application/json", "X-Client-Id": "p", "Not-Before": "tomorrow"}, 400},
			{"batch", post, path + "/batch", `[{"clientId":"p","body":{"a":1}},{"clientId":"q","body":[1],"notBefore":30,"idempotencyKey":"k"}]`, map[string]string{"Content-Type": "application/json"}, 200},
			{"batch items refused", post, path + "/batch", `[{"clientId":"p"},{"clientId":"p","body":1,"extra":2},7,{"clientId":"p","body":"` + strings.Repeat("x", 100) + `"}]`, map[string]string{"Content-Type": "application/json"}, 200},
			{"batch NDJSON", post, path + "/batch", "{\"clientId\":\"p\",\"body\":{}}\n\n{\"clientId\":\"p\",\"body\":null}\nnot JSON\n", map[string]string{"Content-Type": "application/x-ndjson"}, 200},
			{"batch empty", post, path + "/batch", `[]`, map[string]string{"Content-Type": "application/json"}, 400},
			{"batch not an array", post, path + "/batch", `{"clientId":"p","body":{}}`, map[string]string{"Content-Type": "application/json"}, 400},
			{"batch not JSON", post, path + "/batch", `a=1`, map[string]string{"Content-Type": "text/plain"}, 415},
			{"status disabled", http.MethodGet, path + "/" + request.NewID(time.Now()), "", nil, 501},
			{"openapi.json", http.MethodGet, "/v1/openapi.json", "", nil, 200},
			{"healthz", http.MethodGet, "/healthz", "", nil, 200},
			{"readyz", http.MethodGet, "/readyz", "", nil, 200},
			{"no route", http.MethodGet, "/v2/nothing", "", nil, 404},
			{"wrong method", http.MethodDelete, "/healthz", "", nil, 405},
		})
	})
	t.Run("Duplicate", func(t *testing.T) {
		t.Parallel()
		url, client := serveIngest(t, ingest.Config{}, publisher{duplicate: true}, readiness{})
		run(t, client, url, []exchange{{"duplicate", post, path, `{}`, map[string]string{"Content-Type": "application/json", "X-Client-Id": "p", "Idempotency-Key": "k"}, 202}})
	})
	for _, c := range []struct {
		name string
		err  error
		want int
	}{
		{"BacklogFull", request.ErrBacklogFull, 429},
		{"QueueFull", request.ErrQueueFull, 503},
		{"Unavailable", errors.New("no leader"), 503},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			url, client := serveIngest(t, ingest.Config{}, publisher{err: c.err}, readiness{})
			run(t, client, url, []exchange{{c.name, post, path, `{}`, jsonCT, c.want}})
		})
	}
	t.Run("BatchTooLarge", func(t *testing.T) {
		t.Parallel()
		url, client := serveIngest(t, ingest.Config{BatchMaxItems: 1}, publisher{}, readiness{})
		run(t, client, url, []exchange{{"too many", post, path + "/batch", `[{"clientId":"p","body":1},{"clientId":"p","body":2}]`, map[string]string{"Content-Type": "application/json"}, 413}})
	})
	t.Run("BatchRefused", func(t *testing.T) {
		t.Parallel()
		url, client := serveIngest(t, ingest.Config{}, publisher{err: request.ErrBacklogFull}, readiness{})
		run(t, client, url, []exchange{{"backlog full", post, path + "/batch", `[{"clientId":"p","body":1}]`, map[string]string{"Content-Type": "application/json"}, 200}})
	})
	t.Run("Status", func(t *testing.T) {
		t.Parallel()
		now := time.Now().UTC()
		id := func(n int) string { return request.NewID(now.Add(time.Duration(n) * time.Millisecond)) }
		accepted := func(id string) request.Event {
			return request.Event{Type: request.EventAccepted, ID: id, ClientID: "p", At: now, AcceptedAt: now, NotBefore: now.Add(time.Minute), Seq: 9}
		}
		ev := func(id string, typ request.EventType, attempt, status int, reason request.Reason) request.Event {
			return request.Event{Type: typ, ID: id, ClientID: "p", At: now.Add(time.Second), Attempt: attempt, Status: status, Error: "raven said no", Reason: reason, Cycle: 1}
		}
		queued, inFlight, delivered, dead, unknown, failing := id(1), id(2), id(3), id(4), id(5), id(6)
		st := statuses{failing: failing, events: map[string][]request.Event{
			queued:    {accepted(queued), ev(queued, request.EventAttemptFailed, 1, 500, "")},
			inFlight:  {accepted(inFlight), ev(inFlight, request.EventAttemptStarted, 2, 0, "")},
			delivered: {accepted(delivered), ev(delivered, request.EventDelivered, 3, 200, "")},
			dead:      {accepted(dead), ev(dead, request.EventDeadLettered, 3, 400, request.ReasonPermanent)},
		}}
		url, client := serveIngest(t, ingest.Config{Status: st}, publisher{}, readiness{})
		get := http.MethodGet
		run(t, client, url, []exchange{
			{"queued", get, path + "/" + queued + "?clientId=p", "", nil, 200},
			{"in flight", get, path + "/" + inFlight + "?clientId=p", "", nil, 200},
			{"delivered", get, path + "/" + delivered + "?clientId=p&wait=1s", "", nil, 200},
			{"dead-lettered", get, path + "/" + dead + "?clientId=p", "", nil, 200},
			{"unknown", get, path + "/" + unknown + "?clientId=p&wait=1ms", "", nil, 200},
			{"id invalid", get, path + "/not-an-id?clientId=p", "", nil, 400},
			{"client missing", get, path + "/" + queued, "", nil, 400},
			{"client invalid", get, path + "/" + queued + "?clientId=%01", "", nil, 400},
			{"wait invalid", get, path + "/" + queued + "?clientId=p&wait=soon", "", nil, 400},
			{"unavailable", get, path + "/" + failing + "?clientId=p", "", nil, 503},
		})
	})
	t.Run("NotReady", func(t *testing.T) {
		t.Parallel()
		url, client := serveIngest(t, ingest.Config{}, publisher{}, readiness{err: errors.New("no stream")})
		run(t, client, url, []exchange{{"not ready", http.MethodGet, "/readyz", "", nil, 503}})
	})
	t.Run("Tenants", func(t *testing.T) {
		t.Parallel()
		sum := sha256.Sum256([]byte("tok"))
		file := filepath.Join(t.TempDir(), "tokens")
		if err := os.WriteFile(file, []byte("sha256:"+hex.EncodeToString(sum[:])+" tenant=acme clients=acme-* delayed=1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		tokens, err := ingest.NewTokens(file, nil)
		if err != nil {
			t.Fatal(err)
		}
		// The key's request was stored before with another body: its accepted event says so.
		first := request.IDFromKey("acme", "acme-1", "k")
		st := statuses{events: map[string][]request.Event{first: {{Type: request.EventAccepted, ID: first, ClientID: "acme-1", At: time.Now(), AcceptedAt: time.Now(), BodyDigest: "another"}}}}
		url, client := serveIngest(t, ingest.Config{Tokens: tokens, Status: st}, publisher{}, readiness{})
		dupURL, dupClient := serveIngest(t, ingest.Config{Tokens: tokens, Status: st}, publisher{duplicate: true}, readiness{})
		as := func(client string, more ...string) map[string]string {
			h := map[string]string{"Content-Type": "application/json", "Authorization": "Bearer tok", "X-Client-Id": client}
			for i := 0; i+1 < len(more); i += 2 {
				h[more[i]] = more[i+1]
			}
			return h
		}
		run(t, client, url, []exchange{
			{"another tenant's client", post, path, `{}`, as("globex-1"), 403},
			{"delayed within the share", post, path, `{}`, as("acme-1", "Not-Before", "600"), 202},
			{"delayed past the share", post, path, `{}`, as("acme-2", "Not-Before", "600"), 429},
			{"batch with another tenant's client", post, path + "/batch", `[{"clientId":"globex-1","body":{}},{"clientId":"acme-1","body":{}}]`, as(""), 200},
		})
		run(t, dupClient, dupURL, []exchange{
			{"key reused with another body", post, path, `{}`, as("acme-1", "Idempotency-Key", "k"), 409},
			{"key reused in a batch", post, path + "/batch", `[{"clientId":"acme-1","idempotencyKey":"k","body":{}}]`, as(""), 200},
		})
	})
	t.Run("Unauthorized", func(t *testing.T) {
		t.Parallel()
		tokens, err := ingest.NewTokens("", []string{"tok"})
		if err != nil {
			t.Fatal(err)
		}
		url, client := serveIngest(t, ingest.Config{Tokens: tokens}, publisher{}, readiness{})
		run(t, client, url, []exchange{
			{"no token", post, path, `{}`, jsonCT, 401},
			{"token", post, path, `{}`, map[string]string{"Content-Type": "application/json", "X-Client-Id": "p", "Authorization": "Bearer tok"}, 202},
		})
	})
}

// TestAdminRefusals holds the admin API's refusals of callers to the document, on every
// documented route: they come before any handler, so no queue is needed.
func TestAdminRefusals(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, token, auth string
		want              int
	}{
		{"Disabled", "", "Bearer x", 403},
		{"NoToken", "s3cret", "", 401},
		{"WrongToken", "s3cret", "Bearer wrong", 401},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			client := &http.Client{Transport: openapitest.NewChecker(t, openapi.Admin()).Transport(t, nil)}
			for _, route := range openapitest.Routes(t, openapi.Admin()) {
				method, path, _ := strings.Cut(route, " ")
				path = strings.ReplaceAll(path, "{id}", "some-id")
				// A handler of its own for each route: every route's first refusal, not the
				// throttle's 429 after a few (TestAdminThrottles).
				r := chi.NewRouter()
				r.Mount("/admin", new(admin.Service).Handler(c.token))
				srv := httptest.NewServer(r)
				run(t, client, srv.URL, []exchange{{route, method, path, "", map[string]string{"Authorization": c.auth}, c.want}})
				srv.Close()
			}
		})
	}
}

// An address that keeps sending wrong tokens is held back with 429, as the document says.
func TestAdminThrottles(t *testing.T) {
	t.Parallel()
	r := chi.NewRouter()
	r.Mount("/admin", new(admin.Service).Handler("s3cret"))
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: openapitest.NewChecker(t, openapi.Admin()).Transport(t, nil)}
	wrong := exchange{"GET /v1/steering", "GET", "/admin/v1/steering", "", map[string]string{"Authorization": "Bearer wrong"}, http.StatusUnauthorized}
	for range httpapi.FreeTries {
		run(t, client, srv.URL, []exchange{wrong})
	}
	// Each wrong try after those doubles the wait (1 s, 2 s, 4 s, ...): however slow the
	// machine between two calls, one of the next few finds the address held back.
	for range 6 {
		req, _ := http.NewRequest("GET", srv.URL+"/admin/v1/steering", nil)
		req.Header.Set("Authorization", "Bearer wrong")
		resp, err := client.Do(req) // the checker holds the answer to the document
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			return
		}
	}
	t.Fatal("six more wrong tokens after the free tries and never a 429")
}

// TestAdminExchanges holds the admin API's answers to the document, on a real queue
// with requests, dead letters, status records and steering in it. No dispatcher runs:
// one stand-in answers questions about client d's lane and a request it delivered.
func TestAdminExchanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc, err := queue.Connect(queuetest.Server(t).ClientURL(), "openapi-test", zerolog.Nop(), queue.Security{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	q, err := nc.Open(ctx, queue.Config{Partitions: 4}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := q.Control(ctx, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	svc, err := admin.New(admin.Config{Queue: q, Control: ctl, LaneWait: 20 * time.Millisecond, Interval: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i, client := range []string{"a", "a", "a", "b", "c"} {
		body := `{"n":1}`
		if i == 2 {
			body = "\xff not UTF-8" // shown in base64
		}
		if _, err := q.Publish(ctx, request.Request{ID: fmt.Sprintf("r%d", i), ClientID: client, ContentType: "application/json", Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	// Bury c's request, and a's first, as a dispatcher would.
	for _, c := range []struct {
		client string
		reason request.Reason
	}{{"c", request.ReasonPermanent}, {"a", request.ReasonAttemptsExhausted}} {
		lane, _, ok, err := q.ClientLane(ctx, c.client)
		if err != nil || !ok {
			t.Fatalf("client %s: %v %v", c.client, ok, err)
		}
		st, _, err := q.Head(ctx, lane)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		if err := q.AddDeadLetter(ctx, st, request.Verdict{Reason: c.reason, LastStatus: 500, LastError: "", Attempts: 3, FirstAttempt: now.Add(-time.Minute), LastAttempt: now}); err != nil {
			t.Fatal(err)
		}
		if err := q.Delete(ctx, st.Lane, st.Seq); err != nil {
			t.Fatal(err)
		}
	}
	queued, inFlight, delivered, dead := requestsWithRecords(t, q)

	r := chi.NewRouter()
	r.Mount("/admin", svc.Handler("s3cret"))
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: openapitest.NewChecker(t, openapi.Admin()).Transport(t, nil)}
	auth := map[string]string{"Authorization": "Bearer s3cret"}
	withJSON := map[string]string{"Authorization": "Bearer s3cret", "Content-Type": "application/json"}
	const get, post, put = http.MethodGet, http.MethodPost, http.MethodPut
	run(t, client, srv.URL, []exchange{
		{"clients", get, "/admin/v1/clients", "", auth, 200},
		{"clients by age", get, "/admin/v1/clients?sort=age&limit=1&page=2", "", auth, 200},
		{"clients bad sort", get, "/admin/v1/clients?sort=name", "", auth, 400},
		{"dead letters", get, "/admin/v1/deadletters", "", auth, 200},
		{"dead letters filtered", get, "/admin/v1/deadletters?client=a&reason=attempts_exhausted&since=1h&limit=5", "", auth, 200},
		{"dead letters bodies", get, "/admin/v1/deadletters?body=true", "", auth, 200},
		{"dead letters bad since", get, "/admin/v1/deadletters?since=yesterday", "", auth, 400},
		{"replay dry run", post, "/admin/v1/replay", `{"client":"a","dryRun":true}`, withJSON, 200},
		{"replay dry run by a reason", post, "/admin/v1/replay", `{"reason":"attempts_exhausted","dryRun":true}`, withJSON, 200},
		{"replay of a reason in kebab-case", post, "/admin/v1/replay", `{"reason":"attempts-exhausted","dryRun":true}`, withJSON, 400},
		{"replay of a reason there is not", post, "/admin/v1/replay", `{"reason":"tired","dryRun":true}`, withJSON, 400},
		{"replay everything unconfirmed", post, "/admin/v1/replay", `{}`, withJSON, 400},
		{"replay", post, "/admin/v1/replay", `{"reason":"permanent"}`, withJSON, 200},
		{"steering", get, "/admin/v1/steering", "", auth, 200},
		{"interval", put, "/admin/v1/interval", `{"interval":"10s"}`, withJSON, 200},
		{"interval bad", put, "/admin/v1/interval", `{"interval":"soon"}`, withJSON, 400},
		{"client interval", put, "/admin/v1/client/interval", `{"client":"a","interval":"30s"}`, withJSON, 200},
		{"pause", post, "/admin/v1/client/pause", `{"client":"a"}`, withJSON, 200},
		{"pause unknown field", post, "/admin/v1/client/pause", `{"client":"a","for":"ever"}`, withJSON, 400},
		{"clients steered", get, "/admin/v1/clients", "", auth, 200},
		{"steering steered", get, "/admin/v1/steering", "", auth, 200},
		{"resume", post, "/admin/v1/client/resume", `{"client":"a"}`, withJSON, 200},
		{"purge unconfirmed", post, "/admin/v1/client/purge", `{"client":"b"}`, withJSON, 400},
		{"purge", post, "/admin/v1/client/purge", `{"client":"b","confirm":"b"}`, withJSON, 200},
		{"interval default", put, "/admin/v1/interval", `{"interval":"default"}`, withJSON, 200},
		{"status", get, "/admin/v1/status", "", auth, 200},
		{"budget", get, "/admin/v1/budget", "", auth, 200},
		{"budget set", put, "/admin/v1/budget", `{"maxRate":500,"maxInFlight":"none"}`, withJSON, 200},
		{"budget set under snake_case keys", put, "/admin/v1/budget", `{"max_rate":400,"max_inflight":"none"}`, withJSON, 400},
		{"budget steered", get, "/admin/v1/budget", "", auth, 200},
		{"budget bad", put, "/admin/v1/budget", `{"maxRate":"fast"}`, withJSON, 400},
		{"budget configured", put, "/admin/v1/budget", `{"maxRate":"configured","maxInFlight":null}`, withJSON, 200},
		{"request queued", get, "/admin/v1/requests/r2?client=a", "", auth, 200},
		{"request queued, no client nor record", get, "/admin/v1/requests/r2", "", auth, 200},
		{"request queued, with its record", get, "/admin/v1/requests/" + queued + "?client=d", "", auth, 200},
		{"request queued, client from its acceptance", get, "/admin/v1/requests/" + queued, "", auth, 200},
		{"request in flight", get, "/admin/v1/requests/" + inFlight + "?client=d", "", auth, 200},
		{"request dead-lettered", get, "/admin/v1/requests/r0?client=a", "", auth, 200},
		{"request dead-lettered, no client", get, "/admin/v1/requests/r0", "", auth, 200},
		{"request dead-lettered, by its record", get, "/admin/v1/requests/" + dead + "?client=d", "", auth, 200},
		{"request delivered", get, "/admin/v1/requests/" + delivered, "", auth, 200},
		{"request unknown", get, "/admin/v1/requests/nothing", "", auth, 200},
		{"request bad client", get, "/admin/v1/requests/r2?client=%01", "", auth, 400},
	})

	// The lookups show what they are named for, so the checker saw each part of the
	// answer. They go to a service that waits a second for the stand-in dispatcher (the
	// one above waits 20 ms: its answers' schemas are checked, with or without the
	// stand-in's part); should its answer miss even that, a lookup without it is made
	// again.
	lookups, err := admin.New(admin.Config{Queue: q, Control: ctl, LaneWait: time.Second, Interval: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lr := chi.NewRouter()
	lr.Mount("/admin", lookups.Handler("s3cret"))
	lsrv := httptest.NewServer(lr)
	t.Cleanup(lsrv.Close)
	for _, c := range []struct {
		path                   string
		state                  request.State
		lane, delivery, record bool
	}{
		{"r2?client=a", request.StateQueued, false, false, false},
		{queued + "?client=d", request.StateQueued, true, false, false}, // no stored event: the queue holds it (ADR 18)
		{inFlight + "?client=d", request.StateInFlight, true, false, true},
		{queued, request.StateQueued, true, false, false},    // by its id alone: found in the queue
		{inFlight, request.StateInFlight, true, false, true}, // its client found from its first attempt
		{"r0", request.StateDeadLettered, false, false, false},
		{dead + "?client=d", request.StateDeadLettered, false, false, true},
		{delivered, request.StateDelivered, false, true, true},
		{"nothing", request.StateUnknown, false, false, false},
	} {
		deadline := time.Now().Add(30 * time.Second)
		for tries := 1; ; tries++ {
			rs := lookup(t, client, lsrv.URL+"/admin/v1/requests/"+c.path, auth)
			if rs.State == c.state && (rs.Lane != nil) == c.lane && (rs.Delivery != nil) == c.delivery &&
				(rs.Record != nil) == c.record && (rs.DeadLetter != nil) == (c.path == "r0") {
				break
			}
			if time.Now().After(deadline) {
				b, _ := json.Marshal(rs)
				t.Errorf("request %s, the last of %d lookups in 30 s: %s", c.path, tries, b)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// requestsWithRecords queues requests for client d and writes status records as ingest
// and the dispatchers would: queued (behind inFlight), inFlight (at the head of d's
// queue), delivered and dead (records only: the one still remembered by a dispatcher,
// the other no longer in the dead-letter stream). A stand-in dispatcher, until the test
// ends, answers questions about d's lane (in flight) and the delivery of delivered,
// and no other query, as if no dispatcher held the rest.
func requestsWithRecords(t *testing.T, q *queue.Queue) (queued, inFlight, delivered, dead string) {
	t.Helper()
	ctx := context.Background()
	now := time.Now().UTC()
	inFlight, queued = request.NewID(now), request.NewID(now.Add(time.Millisecond))
	delivered, dead = request.NewID(now.Add(2*time.Millisecond)), request.NewID(now.Add(3*time.Millisecond))
	write := func(e request.Event) {
		t.Helper()
		e.ClientID, e.At = "d", now
		if err := q.WriteEvent(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	// The queued one has no stored event: the queue holds it (ADR 18).
	seqs := map[string]uint64{}
	for _, id := range []string{inFlight, queued} {
		receipt, err := q.Publish(ctx, request.Request{ID: id, ClientID: "d", ContentType: "application/json", Body: []byte(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		seqs[id] = receipt.Seq
	}
	write(request.Event{Type: request.EventAttemptStarted, ID: inFlight, Attempt: 2, Seq: seqs[inFlight], AcceptedAt: now})
	for _, id := range []string{delivered, dead} {
		write(request.Event{Type: request.EventAttemptFailed, ID: id, Attempt: 1, Error: "timeout", Seq: 1, AcceptedAt: now})
	}
	write(request.Event{Type: request.EventDelivered, ID: delivered, Attempt: 2, Status: 202})
	write(request.Event{Type: request.EventDeadLettered, ID: dead, Attempt: 2, Status: 400, Reason: request.ReasonPermanent})

	lane, _, ok, err := q.ClientLane(ctx, "d")
	if err != nil || !ok {
		t.Fatalf("client d: %v %v", ok, err)
	}
	subject := lane.Subject()
	stop, err := q.ServeQuestions("dispatcher-1", func(_ context.Context, name string, body []byte) ([]byte, error) {
		asked := string(body)
		switch {
		case name == introspect.NameLanes && strings.Contains(asked, subject):
			return json.Marshal(introspect.LanesAnswer{Instance: "dispatcher-1",
				Lanes: []schedule.LaneInfo{{Subject: subject, State: schedule.LaneInFlight, Attempts: 1, LastEnd: now, Interval: 5 * time.Second}}})
		case name == introspect.NameDelivered && strings.Contains(asked, delivered):
			return json.Marshal(introspect.DeliveredAnswer{Instance: "dispatcher-1",
				Delivered: []introspect.Delivery{{ID: delivered, Subject: subject, Attempt: 2, Delivered: now}}})
		}
		return nil, errors.New("not asked about what it holds") // no answer
	}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return queued, inFlight, delivered, dead
}

// lookup asks the admin API where a request is.
func lookup(t *testing.T, client *http.Client, url string, header map[string]string) admin.RequestState {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rs admin.RequestState
	if err := json.NewDecoder(resp.Body).Decode(&rs); err != nil {
		t.Fatalf("GET %s: %d: %v", url, resp.StatusCode, err)
	}
	return rs
}
