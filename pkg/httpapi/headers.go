package httpapi

import "net/http"

// APIContentSecurityPolicy is the Content-Security-Policy of an answer that is data, not
// a page: nothing in it may load, run or be framed, should a browser ever render it.
const APIContentSecurityPolicy = "default-src 'none'; frame-ancestors 'none'"

// SecurityHeaders is a middleware that sets on every answer the headers that keep a
// browser from reading it as something it is not: the Content-Security-Policy csp,
// nosniff (an answer is only ever its Content-Type; a stored body inside JSON is never
// sniffed into HTML), no framing, no referrer, and no caching (answers carry one
// caller's requests). They are set before the handler runs, so its errors, 404s and
// 405s carry them too.
func SecurityHeaders(csp string) func(next http.Handler) http.Handler {
	// Set once, not per answer: net/http only reads a header's values.
	headers := [...]struct {
		name   string
		values []string
	}{
		{"Content-Security-Policy", []string{csp}},
		{"X-Content-Type-Options", []string{"nosniff"}},
		{"X-Frame-Options", []string{"DENY"}},
		{"Referrer-Policy", []string{"no-referrer"}},
		{"Cache-Control", []string{"no-store"}},
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h := w.Header()
			for _, hv := range headers {
				h[hv.name] = hv.values
			}
			next.ServeHTTP(w, r)
		})
	}
}
