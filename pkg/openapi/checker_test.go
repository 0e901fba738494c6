package openapi_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/penguinhq/dispatcher/pkg/openapi"
	"github.com/penguinhq/dispatcher/pkg/openapi/openapitest"
)

// recorder is a testing.TB that keeps the errors reported to it instead of failing.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recorder) reported() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.errs, "\n")
}

// TestCheckerBites shows the Checker finding answers and requests the document does not
// allow, and passing those it does.
func TestCheckerBites(t *testing.T) {
	t.Parallel()
	c := openapitest.NewChecker(t, openapi.Ingest())
	post := func(body string, header ...string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/v1/requests", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Set(header[i], header[i+1])
		}
		return r
	}
	answer := func(status int, ct, body string, header ...string) *http.Response {
		h := http.Header{"Content-Type": {ct}}
		for i := 0; i+1 < len(header); i += 2 {
			h.Set(header[i], header[i+1])
		}
		return &http.Response{StatusCode: status, Header: h, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}
	}
	const (
		id      = "01jdq3vq0r5x8m2k7c4n6p9t1w"
		problem = `{"type":"about:blank","title":"Service Unavailable","status":503,"code":"queue_full","detail":"retry"}`
	)
	for _, c2 := range []struct {
		name     string
		req      *http.Request
		reqBody  string
		resp     *http.Response
		respBody string
		want     string // in the report; empty: no report
	}{
		{"OK", post(`{"clientId":"p"}`), `{"clientId":"p"}`, answer(202, "application/json", ""), `{"id":"` + id + `","clientId":"p","status":"queued"}`, ""},
		{"ErrMissingID", post(`{"clientId":"p"}`), `{"clientId":"p"}`, answer(202, "application/json", ""), `{"clientId":"p","status":"queued"}`, "id"},
		{"ErrUndeclaredField", post(`{}`, "X-Client-Id", "p"), `{}`, answer(202, "application/json", ""), `{"id":"` + id + `","clientId":"p","status":"queued","seq":7}`, "seq"},
		{"ErrWrongStatusValue", post(`{}`, "X-Client-Id", "p"), `{}`, answer(202, "application/json", ""), `{"id":"` + id + `","clientId":"p","status":"stored"}`, "status"},
		{"ErrBadDate", post(`{}`, "X-Client-Id", "p"), `{}`, answer(202, "application/json", ""), `{"id":"` + id + `","clientId":"p","status":"queued","notBefore":"tomorrow"}`, "notBefore"},
		{"ErrUndocumentedStatus", post(`{}`, "X-Client-Id", "p"), `{}`, answer(200, "application/json", ""), `{"id":"` + id + `","clientId":"p","status":"queued"}`, "200"},
		{"ErrRetryAfterMissing", post(`{}`, "X-Client-Id", "p"), `{}`, answer(503, "application/problem+json", ""), problem, "Retry-After"},
		{"RetryAfter", post(`{}`, "X-Client-Id", "p"), `{}`, answer(503, "application/problem+json", "", "Retry-After", "30"), problem, ""},
		{"ErrUnlistedCode", post(`{}`, "X-Client-Id", "p"), `{}`, answer(503, "application/problem+json", "", "Retry-After", "30"), strings.Replace(problem, "queue_full", "gone_fishing", 1), "code"},
		{"ErrProblemAsJSON", post(`{}`, "X-Client-Id", "p"), `{}`, answer(503, "application/json", "", "Retry-After", "30"), problem, "application/json"},
		{"ErrAcceptedBadKey", post(`{}`, "X-Client-Id", "p", "Idempotency-Key", strings.Repeat("k", 300)), `{}`, answer(202, "application/json", ""), `{"id":"` + id + `","clientId":"p","status":"queued"}`, "Idempotency-Key"},
		{"RefusedBadKey", post(`{}`, "X-Client-Id", "p", "Idempotency-Key", strings.Repeat("k", 300)), `{}`, answer(400, "application/problem+json", ""), `{"type":"about:blank","title":"Bad Request","status":400,"code":"idempotency_key_invalid","detail":"too long"}`, ""},
		{"ErrUndocumentedRoute", httptest.NewRequest(http.MethodGet, "/v1/clients", nil), "", answer(200, "application/json", ""), `{}`, "no operation GET /v1/clients"},
		{"NotFound", httptest.NewRequest(http.MethodGet, "/v1/clients", nil), "", answer(404, "application/problem+json", ""), `{}`, ""},
	} {
		t.Run(c2.name, func(t *testing.T) {
			t.Parallel()
			rec := &recorder{TB: t}
			c.Response(rec, c2.req, []byte(c2.reqBody), c2.resp, []byte(c2.respBody))
			got := rec.reported()
			switch {
			case c2.want == "" && got != "":
				t.Errorf("reported a valid exchange:\n%s", got)
			case c2.want != "" && !strings.Contains(got, c2.want):
				t.Errorf("report does not mention %q:\n%s", c2.want, got)
			}
			if got != "" {
				t.Logf("the report:\n%s", got)
			}
		})
	}
}

// TestCheckerNDJSON shows a batch sent as NDJSON checked line by line, when the answer
// says every item was stored; items refused in the answer may be wrong on purpose.
func TestCheckerNDJSON(t *testing.T) {
	t.Parallel()
	c := openapitest.NewChecker(t, openapi.Ingest())
	const (
		queued = `{"index":%d,"status":"queued","id":"01jdq3vq0r5x8m2k7c4n6p9t1w","clientId":"p"}`
		failed = `{"index":1,"status":"failed","problem":{"status":400,"code":"body_missing","detail":"no body","retryAfter":5}}`
	)
	allQueued := `{"results":[` + fmt.Sprintf(queued, 0) + `,` + fmt.Sprintf(queued, 1) + `],"accepted":2,"failed":0}`
	oneFailed := `{"results":[` + fmt.Sprintf(queued, 0) + `,` + failed + `],"accepted":1,"failed":1}`
	for _, c2 := range []struct{ name, body, answer, want string }{
		{"OK", "{\"clientId\":\"p\",\"body\":{\"a\":1}}\n{\"clientId\":\"q\",\"body\":[1],\"notBefore\":30}\n", allQueued, ""},
		{"ErrStoredWithoutBody", "{\"clientId\":\"p\",\"body\":{}}\n{\"clientId\":\"q\"}\n", allQueued, "body"},
		{"ErrStoredNotJSON", "{\"clientId\":\"p\",\"body\":{}}\nnot json\n", allQueued, "line 2"},
		{"RefusedWithoutBody", "{\"clientId\":\"p\",\"body\":{}}\n{\"clientId\":\"q\"}\n", oneFailed, ""},
	} {
		t.Run(c2.name, func(t *testing.T) {
			t.Parallel()
			req := httptest.NewRequest(http.MethodPost, "/v1/requests/batch", strings.NewReader(c2.body))
			req.Header.Set("Content-Type", "application/x-ndjson")
			resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}, "Retry-After": {"5"}}}
			rec := &recorder{TB: t}
			c.Response(rec, req, []byte(c2.body), resp, []byte(c2.answer))
			got := rec.reported()
			switch {
			case c2.want == "" && got != "":
				t.Errorf("reported a valid exchange:\n%s", got)
			case c2.want != "" && !strings.Contains(got, c2.want):
				t.Errorf("report does not mention %q:\n%s", c2.want, got)
			}
		})
	}
}
