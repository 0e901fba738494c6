package cli

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// The demo raven refuses the clients its rules name, with their status, and the rules
// change while it runs; a bad rule is refused with a reason.
func TestDemoRavenRefusesChosenClients(t *testing.T) {
	fail, err := ParseFailRules(" bob=503, t-*=400, t-long-*=429 ")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(DemoRaven(zerolog.Nop(), true, fail))
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
