package admin_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The admin API's answers as HTTP wants them: a 405 names the methods the route takes
// in Allow (RFC 9110 §15.5.6), the Bearer scheme's name is read in any case (§11.1),
// and a detail saying <ADMIN_TOKEN> is not HTML-escaped.
func TestAPIAnswersFollowHTTP(t *testing.T) {
	t.Parallel()
	f := setup(t)
	call := func(method, path, auth string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		f.api.ServeHTTP(rec, req)
		return rec
	}
	for path, allow := range map[string]string{"/admin/v1/steering": "GET", "/admin/v1/budget": "GET, PUT", "/admin/v1/replay": "POST"} {
		if rec := call(http.MethodDelete, path, "Bearer "+token); rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != allow {
			t.Errorf("DELETE %s: %d, Allow %q; want 405 with Allow %q", path, rec.Code, rec.Header().Get("Allow"), allow)
		}
	}
	for _, auth := range []string{"bearer " + token, "BEARER " + token} {
		if rec := call(http.MethodGet, "/admin/v1/steering", auth); rec.Code != http.StatusOK {
			t.Errorf("Authorization %q: %d %s, want 200", auth, rec.Code, rec.Body)
		}
	}
	rec := call(http.MethodGet, "/admin/v1/steering", "Basic "+token)
	if body := rec.Body.String(); rec.Code != http.StatusUnauthorized || !strings.Contains(body, "Bearer <ADMIN_TOKEN>") {
		t.Errorf("Basic: %d %s, want 401 whose detail names Bearer <ADMIN_TOKEN> unescaped", rec.Code, body)
	}
}
