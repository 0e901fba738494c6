package httpapi

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
)

// A 405 carries Allow with the methods of the route, also from a router mounted on
// another (as the admin API is on the operators' listener), where the route is what
// follows the mount point.
func TestMethodNotAllowedNamesTheRoutesMethods(t *testing.T) {
	t.Parallel()
	sub := chi.NewRouter()
	ok := func(http.ResponseWriter, *http.Request) {}
	sub.Get("/v1/things/{id}", ok)
	sub.Put("/v1/things/{id}", ok)
	sub.Post("/v1/other", ok)
	sub.MethodNotAllowed(MethodNotAllowed(sub))
	top := chi.NewRouter()
	top.Get("/healthz", ok)
	top.Mount("/admin", sub)
	top.MethodNotAllowed(MethodNotAllowed(top))
	for _, c := range []struct{ method, path, allow string }{
		{http.MethodDelete, "/admin/v1/things/7", "GET, PUT"},
		{http.MethodGet, "/admin/v1/other", "POST"},
		{http.MethodPost, "/healthz", "GET"},
	} {
		rec := httptest.NewRecorder()
		top.ServeHTTP(rec, httptest.NewRequest(c.method, c.path, nil))
		if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != c.allow ||
			!strings.Contains(rec.Body.String(), `"code":"method_not_allowed"`) {
			t.Errorf("%s %s: %d, Allow %q, %s; want 405 method_not_allowed with Allow %q", c.method, c.path, rec.Code, rec.Header().Get("Allow"), rec.Body, c.allow)
		}
	}
}

func TestBearerTokenReadsTheSchemeInAnyCase(t *testing.T) {
	t.Parallel()
	for header, want := range map[string]string{
		"Bearer abc": "abc", "bearer abc": "abc", "BEARER abc": "abc", "Bearer   abc": "abc", "Bearer a<b>c": "a<b>c",
		"": "", "Bearer": "", "Bearer ": "", "Bearerabc": "", "Basic abc": "", "Token abc": "",
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("Authorization", header)
		got, ok := BearerToken(r)
		if got != want || ok != (want != "") {
			t.Errorf("Authorization %q: %q, %v; want %q", header, got, ok, want)
		}
	}
}

// JSON answers read as they were written: no \u003c for <.
func TestJSONAnswersAreNotHTMLEscaped(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	WriteProblem(rec, Problem{Status: http.StatusUnauthorized, Code: "unauthorized", Detail: "send Authorization: Bearer <token> & retry"})
	if body := rec.Body.String(); !strings.Contains(body, `"detail":"send Authorization: Bearer <token> & retry"`) {
		t.Errorf("WriteProblem wrote %s, want the detail unescaped", body)
	}
	rec = httptest.NewRecorder()
	WriteJSON(rec, http.StatusOK, map[string]string{"clientId": "<b>&co", "line": "a\u2028b"})
	if body := rec.Body.String(); body != `{"clientId":"<b>&co","line":"a\u2028b"}`+"\n" {
		t.Errorf("WriteJSON wrote %s, want <, > and & as they are (and U+2028 escaped, as JSON in JavaScript needs)", body)
	}
}
