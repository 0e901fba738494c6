package cli

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/raven"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/webhook"
)

// The demo raven refuses the clients its rules name, with their status, and the rules
// change while it runs; a bad rule is refused with a reason.
func TestDemoRavenRefusesChosenClients(t *testing.T) {
	fail, err := ParseFailRules(" bob=503, t-*=400, t-long-*=429 ")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(DemoRaven(zerolog.Nop(), true, fail, nil))
	defer srv.Close()
	send := func(client string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/", strings.NewReader(`{}`))
		req.Header.Set("X-Client-Id", client)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	call := func(method, path, body string) int {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for client, want := range map[string]int{"bob": 503, "t-1": 400, "t-long-1": 429, "alice": 200} {
		if got := send(client); got != want {
			t.Errorf("%s: %d, want %d", client, got, want)
		}
	}
	if code := call(http.MethodPut, "/fail/alice", "422"); code != 200 {
		t.Fatalf("PUT /fail/alice: %d", code)
	}
	if got := send("alice"); got != 422 {
		t.Errorf("alice after PUT: %d, want 422", got)
	}
	if code := call(http.MethodDelete, "/fail/alice", ""); code != 200 {
		t.Fatalf("DELETE /fail/alice: %d", code)
	}
	if got := send("alice"); got != 200 {
		t.Errorf("alice after DELETE: %d, want 200", got)
	}
	for _, bad := range []string{"200", "abc", "700"} {
		if code := call(http.MethodPut, "/fail/alice", bad); code != 400 {
			t.Errorf("PUT /fail/alice %q: %d, want 400", bad, code)
		}
	}
	for _, bad := range []string{"bob", "bob=ok", "=503", "bob=200"} {
		if _, err := ParseFailRules(bad); err == nil {
			t.Errorf("ParseFailRules(%q) took it", bad)
		}
	}
}

// Given the signing secret, the demo raven accepts what the dispatcher's raven client
// signs, and refuses with 401, without recording it, a request that is unsigned, signed
// with another secret, altered after signing, or signed more than five minutes ago.
func TestDemoRavenVerifiesSignatures(t *testing.T) {
	t.Parallel()
	secrets, err := webhook.ParseSecrets("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		t.Fatal(err)
	}
	other, _ := webhook.ParseSecrets("whsec_" + strings.Repeat("QUFB", 8))
	srv := httptest.NewServer(DemoRaven(zerolog.Nop(), true, nil, secrets))
	defer srv.Close()

	rc, err := raven.New(raven.Config{URL: srv.URL + "/", Signing: secrets})
	if err != nil {
		t.Fatal(err)
	}
	st := request.Stored{Request: request.Request{ID: "r1", ClientID: "alice", ContentType: "application/json", Body: []byte(`{"n":1}`)}}
	if err := rc.Send(context.Background(), st, 1); err != nil {
		t.Fatalf("a signed attempt from the raven client: %v", err)
	}

	send := func(sign []webhook.Secret, signedBody, body string, at time.Time) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/", strings.NewReader(body))
		req.Header.Set("X-Client-Id", "bob")
		req.Header.Set("Idempotency-Key", "r2")
		webhook.Sign(req.Header, sign, "r2", at, []byte(signedBody))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	now := time.Now()
	for _, c := range []struct {
		name             string
		sign             []webhook.Secret
		signedBody, body string
		at               time.Time
	}{
		{"Unsigned", nil, `{"n":2}`, `{"n":2}`, now},
		{"OtherSecret", other, `{"n":2}`, `{"n":2}`, now},
		{"TamperedBody", secrets, `{"n":2}`, `{"n":3}`, now},
		{"Stale", secrets, `{"n":2}`, `{"n":2}`, now.Add(-webhook.Tolerance - time.Minute)},
	} {
		if code := send(c.sign, c.signedBody, c.body, c.at); code != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", c.name, code)
		}
	}
	if code := send(secrets, `{"n":2}`, `{"n":2}`, now); code != http.StatusOK {
		t.Errorf("signed now: %d, want 200", code)
	}
	// The recording raven notes an arrival once it has answered it: the list may lag
	// the answer by a moment.
	var arrivals []struct{ ID string }
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := http.Get(srv.URL + "/arrivals")
		if err != nil {
			t.Fatal(err)
		}
		arrivals = nil
		err = json.NewDecoder(resp.Body).Decode(&arrivals)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(arrivals) >= 2 || time.Now().After(deadline) {
			break
		}
	}
	if len(arrivals) != 2 || arrivals[0].ID != "r1" || arrivals[1].ID != "r2" {
		t.Errorf("arrivals %+v, want the two that verified", arrivals)
	}
}
