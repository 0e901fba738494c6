package httpapi

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/go-chi/chi/v5"
)

// methods are the methods a 405's Allow header may name, in the order it names them.
var methods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodOptions}

// MethodNotAllowed answers 405 method_not_allowed for a route of routes (the chi router
// the handler is set on) that does not take the request's method, with the Allow header
// RFC 9110 §15.5.6 requires: the methods the route takes. chi works them out, but hands
// them only to its own 405 handler, not to one set with MethodNotAllowed; so they are
// found again here, by asking routes which methods it has for the path.
func MethodNotAllowed(routes chi.Routes) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		allowed := AllowedMethods(routes, routePath(r))
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		detail := fmt.Sprintf("%s is not allowed on %s", r.Method, r.URL.Path)
		if len(allowed) > 0 {
			detail += "; it takes " + strings.Join(allowed, ", ")
		}
		WriteProblem(w, Problem{Status: http.StatusMethodNotAllowed, Code: "method_not_allowed", Detail: detail})
	}
}

// AllowedMethods is the methods routes serves path with, in the order of methods.
func AllowedMethods(routes chi.Routes, path string) []string {
	var allowed []string
	for _, m := range methods {
		if routes.Match(chi.NewRouteContext(), m, path) {
			allowed = append(allowed, m)
		}
	}
	return allowed
}

// routePath is the path the router routes r by, as chi works it out: within a router
// mounted on another, what follows the mount point.
func routePath(r *http.Request) string {
	if rctx := chi.RouteContext(r.Context()); rctx != nil && rctx.RoutePath != "" {
		return rctx.RoutePath
	}
	if r.URL.RawPath != "" {
		return r.URL.RawPath
	}
	return r.URL.Path
}

// BearerToken returns the token of the request's "Authorization: Bearer <token>" header;
// false when there is none. The scheme's name is case-insensitive (RFC 9110 §11.1):
// "bearer" and "BEARER" are Bearer too, and one or more spaces may follow it.
func BearerToken(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimLeft(token, " ")
	return token, token != ""
}

// CheckQuery checks a request's query string before its handler reads it with
// URL.Query: one that does not parse (a bad percent-encoding, a ";"), or gives a
// parameter twice, is an error saying so, where URL.Query would drop the part it cannot
// read, or take the first of two values, and the call would act without the filter or
// on another target than was asked.
func CheckQuery(r *http.Request) error {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return fmt.Errorf("the query string cannot be read (%s): separate its parameters with & and percent-encode what needs it", err)
	}
	for name, vs := range q {
		if len(vs) > 1 {
			return fmt.Errorf("?%s= is given %d times: give it once", name, len(vs))
		}
	}
	return nil
}
