package ingest_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/httpapi"
	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// Every answer of ingest, a refusal, a 404, a 405 and a probe as much as a 202, carries
// nosniff and a Content-Security-Policy that lets nothing load: a status answer holds
// raven's stored body inside JSON, which a browser must never read as a page.
func TestEveryAnswerCarriesTheSecurityHeaders(t *testing.T) {
	t.Parallel()
	_, q := embeddedQueue(t)
	const token = "headers-test-token-0123456789abcdef"
	tokens, err := ingest.NewTokens("", []string{token})
	if err != nil {
		t.Fatal(err)
	}
	api, err := ingest.New(ingest.Config{Tokens: tokens, Status: q}, q, q, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	id := request.NewID(time.Now())
	cases := []struct {
		method, path, token, body string
		want                      int
	}{
		{"POST", "/v1/requests", token, `{"clientId":"alice","x":"<script>"}`, 202},
		{"POST", "/v1/requests", token, `{"x":1}`, 400},
		{"POST", "/v1/requests", "", `{"clientId":"alice"}`, 401},
		{"POST", "/v1/requests/batch", token, `[{"clientId":"alice","body":{}}]`, 200},
		{"GET", "/v1/requests/" + id + "?clientId=alice", token, "", 200},
		{"GET", "/v1/requests/" + id, token, "", 400},
		{"DELETE", "/v1/requests/" + id + "?clientId=alice", token, "", 0}, // whatever the dispatchers' absence makes of it
		{"GET", "/v1/requests/batch", token, "", 405},
		{"PUT", "/v1/requests", token, "", 405},
		{"GET", "/nowhere", token, "", 404},
		{"GET", "/v1/openapi.json", token, "", 200},
		{"GET", "/healthz", "", "", 200},
		{"GET", "/readyz", "", "", 200},
	}
	for _, c := range cases {
		req, err := http.NewRequest(c.method, srv.URL+c.path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if c.want != 0 && res.StatusCode != c.want {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, res.StatusCode, c.want)
		}
		if got := res.Header.Get("Content-Security-Policy"); got != httpapi.APIContentSecurityPolicy {
			t.Errorf("%s %s (%d): Content-Security-Policy %q, want %q", c.method, c.path, res.StatusCode, got, httpapi.APIContentSecurityPolicy)
		}
		if got := res.Header.Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("%s %s (%d): X-Content-Type-Options %q, want nosniff", c.method, c.path, res.StatusCode, got)
		}
	}
}
