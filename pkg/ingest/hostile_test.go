package ingest_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// What a hostile-input pass found in ingest's answers (2026-12-07), each refused now with
// the problem that says what to fix.

// serveHeaders answers one request (JSON unless header says otherwise) with an ingest
// API that stores nothing and acknowledges everything; header is name, value pairs (an
// empty value: no such header).
func serveHeaders(t *testing.T, method, path, body string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	api, err := ingest.New(ingest.Config{Status: delivered{}}, stored{}, stored{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		if header[i+1] != "" { // none
			req.Header.Set(header[i], header[i+1])
		}
	}
	rec := httptest.NewRecorder()
	api.Handler().ServeHTTP(rec, req)
	return rec
}

// itemProblems are the codes of a batch answer's items, "" for one accepted.
func itemProblems(t *testing.T, rec *httptest.ResponseRecorder) []string {
	t.Helper()
	var ans struct {
		Results []struct {
			Problem *struct{ Code string } `json:"problem"`
		} `json:"results"`
	}
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &ans) != nil {
		t.Fatalf("batch answered %d %s, want 200 with each item's result", rec.Code, rec.Body)
	}
	codes := make([]string, len(ans.Results))
	for i, r := range ans.Results {
		if r.Problem != nil {
			codes[i] = r.Problem.Code
		}
	}
	return codes
}

// A clientId that raven would read as another client's is refused. Raven reads the
// X-Client-Id header, whose spaces at either end HTTP drops: " gapx" and "gapx " were
// accepted as two clients besides "gapx", and raven received the three 72 and 82 ms
// apart (G2 as raven sees it). A raven that reads the body's clientId instead would see
// another client than ingest spaced: a body's second "clientId", a clientId that is not
// a string, or a key such as "ClientId" that a case-insensitive JSON reader (Go's) takes
// for it were all taken beside a header; and a batch item's body was never compared with
// the item's clientId at all.
func TestAClientIDRavenWouldReadOtherwiseIsRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		header, body, want string
	}{
		{"", `{"clientId":" gapx"}`, "client_id_invalid"},
		{"", `{"clientId":"gapx "}`, "client_id_invalid"},
		{"", `{"clientId":"  "}`, "client_id_invalid"},
		{"hx", `{"clientId":"hx","clientId":"hz"}`, "client_id_invalid"},
		{"hx", `{"clientId":42}`, "client_id_invalid"},
		{"hinv", "{\"clientId\":\"h\xff\"}", "client_id_invalid"},
		{"", `{"clientId":"cx1","ClientId":"cz1"}`, "client_id_invalid"},
		{"cx1", `{"CLIENTID":"cz1"}`, "client_id_invalid"},
		{"", `{"client\u0049d":"cz1","clientId":"cx1"}`, "client_id_invalid"}, // escaped, folded
		{"x", `{"clientId":"` + strings.Repeat("y", 900) + `"}`, "client_id_mismatch"},
		{strings.Repeat("x", 200), `{"clientId":"y"}`, "client_id_invalid"},
		// Taken: a space inside, the same client both ways, other keys, a body with none.
		{"", `{"clientId":"gap x"}`, ""},
		{"hx", `{"clientId":"hx","clientIdx":"hz","client":"hz"}`, ""},
		{"hx", `[{"clientId":"hz"}]`, ""},
		{"hx", `{"n":{"clientId":"hz"}}`, ""},
	} {
		rec := serveHeaders(t, http.MethodPost, "/v1/requests", c.body, request.HeaderClientID, c.header)
		if c.want == "" {
			if rec.Code != http.StatusAccepted {
				t.Errorf("X-Client-Id %q, body %s: %d %s, want 202", c.header, c.body, rec.Code, rec.Body)
			}
			continue
		}
		p := problemOf(t, rec)
		if rec.Code != http.StatusBadRequest || p.Code != c.want || len(p.Detail) > 400 {
			t.Errorf("X-Client-Id %.20q, body %.60s: %d %+.200v, want 400 %s with a short detail", c.header, c.body, rec.Code, p, c.want)
		}
	}
	batch := `[{"clientId":" ikb","body":{}},{"clientId":"bm1","body":{"clientId":"other"}},` +
		`{"clientId":"bm1","body":{"ClientID":"bm1"}},{"clientId":"bm1","body":{"clientId":"bm1"}},{"clientId":"bm1","body":[1]},` +
		`{"clientId":"bm1","body":{},"idempotencyKey":" pk "}]`
	got := itemProblems(t, serveHeaders(t, http.MethodPost, "/v1/requests/batch", batch))
	want := []string{"client_id_invalid", "client_id_mismatch", "client_id_invalid", "", "", "idempotency_key_invalid"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("batch items answered %q, want %q", got, want)
	}
}

// Not-Before and Not-After of one request are read against one clock reading: the same
// seconds in both were a deadline a microsecond after the request's start, accepted with
// 202 and dead-lettered as expired without an attempt. A deadline at its start or before
// is refused, in a single POST and in a batch item.
func TestANotAfterAtItsNotBeforeIsRefused(t *testing.T) {
	t.Parallel()
	at := time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)
	for _, c := range [][2]string{{"60", "60"}, {at, at}, {"120", "60"}} {
		rec := serveHeaders(t, http.MethodPost, "/v1/requests", `{"clientId":"na"}`, ingest.HeaderNotBefore, c[0], ingest.HeaderNotAfter, c[1])
		if p := problemOf(t, rec); rec.Code != http.StatusBadRequest || p.Code != "not_after_invalid" {
			t.Errorf("Not-Before %s, Not-After %s: %d %+v, want 400 not_after_invalid", c[0], c[1], rec.Code, p)
		}
	}
	if rec := serveHeaders(t, http.MethodPost, "/v1/requests", `{"clientId":"na"}`, ingest.HeaderNotBefore, "60", ingest.HeaderNotAfter, "61"); rec.Code != http.StatusAccepted {
		t.Errorf("Not-Before 60, Not-After 61: %d %s, want 202", rec.Code, rec.Body)
	}
	got := itemProblems(t, serveHeaders(t, http.MethodPost, "/v1/requests/batch",
		`[{"clientId":"na","body":{},"notBefore":60,"notAfter":60},{"clientId":"na","body":{},"notBefore":60,"notAfter":61}]`))
	if strings.Join(got, ",") != "not_after_invalid," {
		t.Errorf("batch items answered %q, want not_after_invalid for the first only", got)
	}
}

// What a request's route cannot read is said, not taken for something else: a query
// string that does not parse (it answered client_id_missing for ?clientId=%zz), a
// clientId or wait given twice (the first was taken; a wait too long to count was
// refused where 1h is cut), GET on the batch route (it answered id_invalid for a request named "batch"), a body with a
// Content-Encoding (a gzip body was "not valid JSON", a "br" one stored as it came), and
// the headers of a single request on a batch, whose items carry those fields (they were
// dropped without a word: a retried batch with an Idempotency-Key was stored twice).
func TestWhatARouteCannotReadIsRefusedAsSuch(t *testing.T) {
	t.Parallel()
	id := request.NewID(time.Now())
	for _, c := range []struct {
		method, path, body string
		header             []string
		status             int
		code               string
	}{
		{http.MethodGet, "/v1/requests/" + id + "?clientId=%zz", "", nil, 400, "query_invalid"},
		{http.MethodGet, "/v1/requests/" + id + "?clientId=victim;wait=5s", "", nil, 400, "query_invalid"},
		{http.MethodDelete, "/v1/requests/" + id + "?clientId=%zz", "", nil, 400, "query_invalid"},
		{http.MethodGet, "/v1/requests/batch", "", nil, 405, "method_not_allowed"},
		{http.MethodDelete, "/v1/requests/batch?clientId=a", "", nil, 405, "method_not_allowed"},
		{http.MethodPost, "/v1/requests", `{"clientId":"a"}`, []string{"Content-Encoding", "br"}, 415, "unsupported_media_type"},
		{http.MethodPost, "/v1/requests", "\x1f\x8b", []string{"Content-Encoding", "gzip"}, 415, "unsupported_media_type"},
		{http.MethodPost, "/v1/requests/batch", `[{"clientId":"a","body":{}}]`, []string{"Content-Encoding", "gzip"}, 415, "unsupported_media_type"},
		{http.MethodPost, "/v1/requests/batch", `[{"clientId":"a","body":{}}]`, []string{"Idempotency-Key", "k1"}, 400, "idempotency_key_invalid"},
		{http.MethodPost, "/v1/requests/batch", `[{"clientId":"a","body":{}}]`, []string{"X-Client-Id", "a"}, 400, "client_id_invalid"},
		{http.MethodPost, "/v1/requests/batch", `[{"clientId":"a","body":{}}]`, []string{"Not-Before", "60"}, 400, "not_before_invalid"},
		{http.MethodPost, "/v1/requests/batch", `[{"clientId":"a","body":{}}]`, []string{"Not-After", "60"}, 400, "not_after_invalid"},
		{http.MethodGet, "/v1/requests/" + id + "?clientId=a&clientId=b", "", nil, 400, "query_invalid"},
		{http.MethodGet, "/v1/requests/" + id + "?clientId=a&wait=1s&wait=2s", "", nil, 400, "query_invalid"},
		{http.MethodDelete, "/v1/requests/" + id + "?clientId=a&clientId=a", "", nil, 400, "query_invalid"},
		{http.MethodGet, "/v1/requests/" + id + "?clientId=a&wait=30", "", nil, 400, "wait_invalid"},
		{http.MethodGet, "/v1/requests/" + id + "?clientId=a&wait=h", "", nil, 400, "wait_invalid"},
		{http.MethodGet, "/v1/requests/" + id + "?clientId=a&wait=-99999999999h", "", nil, 400, "wait_invalid"},
		// Taken as before; a wait too long to count is cut like any long one.
		{http.MethodGet, "/v1/requests/" + id + "?clientId=a%20b&wait=1s", "", nil, 200, ""},
		{http.MethodGet, "/v1/requests/" + id + "?clientId=a&wait=9999999999h", "", nil, 200, ""},
		{http.MethodGet, "/v1/requests/" + id + "?clientId=a&wait=1.5h30m", "", nil, 200, ""},
		{http.MethodPost, "/v1/requests", `{"clientId":"a"}`, []string{"Content-Encoding", "identity"}, 202, ""},
	} {
		rec := serveHeaders(t, c.method, c.path, c.body, c.header...)
		if rec.Code != c.status || c.code != "" && problemOf(t, rec).Code != c.code {
			t.Errorf("%s %s %q: %d %s, want %d %s", c.method, c.path, c.header, rec.Code, rec.Body, c.status, c.code)
		}
		if c.status == 405 && rec.Header().Get("Allow") != "POST" {
			t.Errorf("%s %s: Allow %q, want POST", c.method, c.path, rec.Header().Get("Allow"))
		}
	}
}

// A route not found is named as it was sent: POST /v1/%72equests was answered "no route
// POST /v1/requests; requests go to POST /v1/requests".
func TestANotFoundRouteIsNamedAsSent(t *testing.T) {
	t.Parallel()
	rec := serveHeaders(t, http.MethodPost, "/v1/%72equests", `{"clientId":"m"}`)
	if p := problemOf(t, rec); rec.Code != http.StatusNotFound || !strings.Contains(p.Detail, "/v1/%72equests") {
		t.Errorf("POST /v1/%%72equests: %d %+v, want 404 naming /v1/%%72equests", rec.Code, p)
	}
}

// A duplicate's 202 does not repeat the Not-Before it was sent again with: the queue
// holds the first copy, with its own (the answer said the retry's time, the status the
// stored one's). Its accepted event carries neither time.
func TestADuplicateAnswersWithoutTheTimesItWasSentAgainWith(t *testing.T) {
	t.Parallel()
	_, q := embeddedQueue(t)
	url := serveIngest(t, ingest.Config{}, q)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := call(t, ctx, http.MethodPost, url+"/v1/requests", "", `{"v":1}`, "X-Client-Id", "ik4", "Idempotency-Key", "nbk", "Not-Before", "30")
	again := call(t, ctx, http.MethodPost, url+"/v1/requests", "", `{"v":1}`, "X-Client-Id", "ik4", "Idempotency-Key", "nbk", "Not-Before", "3000")
	if first.Code != http.StatusAccepted || first.NotBefore.IsZero() {
		t.Fatalf("first POST: %+v, want 202 with its notBefore", first)
	}
	if again.Code != http.StatusAccepted || !again.Duplicate || !again.NotBefore.IsZero() {
		t.Errorf("the same key again with Not-Before 3000: %d duplicate %v notBefore %v, want 202 duplicate without a notBefore (the stored one's is %v)",
			again.Code, again.Duplicate, again.NotBefore, first.NotBefore)
	}
}

// A body that is not JSON is refused saying where and why (it said only "not valid
// JSON", also for valid JSON nested deeper than encoding/json reads).
func TestABodyThatIsNotJSONIsRefusedSayingWhere(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]string{
		`{"clientId":"a",}`: "at byte 17",
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001): "depth",
	} {
		rec := serveHeaders(t, http.MethodPost, "/v1/requests", body, request.HeaderClientID, "a")
		if p := problemOf(t, rec); rec.Code != http.StatusBadRequest || p.Code != "malformed_json" || !strings.Contains(p.Detail, want) {
			t.Errorf("body %.30s: %d %+v, want 400 malformed_json saying %q", body, rec.Code, p, want)
		}
	}
	codes := itemProblems(t, serveHeaders(t, http.MethodPost, "/v1/requests/batch", "{\"clientId\":\"a\",\"body\":{}}\n{\"clientId\":\"a\",\"body\":{]}\n", "Content-Type", "application/x-ndjson"))
	if strings.Join(codes, ",") != ",malformed_json" {
		t.Errorf("NDJSON items answered %q, want the second malformed_json", codes)
	}
}

// What the documents allow is taken, and what cannot be read one way is refused, alike on
// both routes: an RFC 3339 time with a lower-case t and z or a leap second (section 5.6
// of the RFC; refused as not_before_invalid before), a batch sent as a +json media type
// (the single route took it, the batch route refused it), and two Content-Type headers
// (the first was taken silently, where two of any other header are refused).
func TestWhatTheStandardsAllowIsTakenAndTwoContentTypesAreNot(t *testing.T) {
	t.Parallel()
	at := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	lower := strings.ToLower(at.Format(time.RFC3339)) // 2026-12-07t07:00:00z
	rec := serveHeaders(t, http.MethodPost, "/v1/requests", `{"clientId":"lt"}`, ingest.HeaderNotBefore, lower)
	var ans struct{ NotBefore time.Time }
	if rec.Code != http.StatusAccepted || json.Unmarshal(rec.Body.Bytes(), &ans) != nil || !ans.NotBefore.Equal(at) {
		t.Errorf("Not-Before %s: %d %s, want 202 with notBefore %s", lower, rec.Code, rec.Body, at.Format(time.RFC3339))
	}
	minute := time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour) // the next midnight UTC, within MAX_NOT_BEFORE
	leap := minute.Add(-time.Second).Format("2006-01-02T15:04:") + "60Z"    // 23:59:60Z, the second after :59
	if rec := serveHeaders(t, http.MethodPost, "/v1/requests", `{"clientId":"lt"}`, ingest.HeaderNotBefore, leap); rec.Code != http.StatusAccepted || !strings.Contains(rec.Body.String(), minute.Format(time.RFC3339)) {
		t.Errorf("Not-Before %s: %d %s, want 202 with notBefore %s", leap, rec.Code, rec.Body, minute.Format(time.RFC3339))
	}
	got := itemProblems(t, serveHeaders(t, http.MethodPost, "/v1/requests/batch",
		`[{"clientId":"lt","body":{},"notBefore":"`+lower+`"},{"clientId":"lt","body":{},"notBefore":"`+lower+`x"}]`, "Content-Type", "application/vnd.penguin+json"))
	if strings.Join(got, ",") != ",not_before_invalid" {
		t.Errorf("a +json batch with a lower-case time and a bad one: items %q, want the first taken, the second not_before_invalid", got)
	}

	api, err := ingest.New(ingest.Config{Status: delivered{}}, stored{}, stored{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/v1/requests", "/v1/requests/batch"} {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`[{"clientId":"lt","body":{}}]`))
		req.Header.Add("Content-Type", "application/json")
		req.Header.Add("Content-Type", "text/plain")
		req.Header.Set(request.HeaderClientID, "lt")
		rec := httptest.NewRecorder()
		api.Handler().ServeHTTP(rec, req)
		if p := problemOf(t, rec); rec.Code != http.StatusUnsupportedMediaType || p.Code != "unsupported_media_type" || !strings.Contains(p.Detail, "send one") {
			t.Errorf("%s with two Content-Types: %d %+v, want 415 unsupported_media_type asking for one", path, rec.Code, p)
		}
	}
}
