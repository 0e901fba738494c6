// Package httpapi holds what the service's HTTP APIs share: RFC 9457 problem details
// and JSON answers.
package httpapi

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// Problem is an RFC 9457 problem detail. Code is a stable, machine-readable name for the
// kind of problem; Detail says what to do about this one.
type Problem struct {
	Type       string        `json:"type"`
	Title      string        `json:"title"`
	Status     int           `json:"status"`
	Code       string        `json:"code"`
	Detail     string        `json:"detail"`
	RetryAfter time.Duration `json:"-"`
}

// WriteProblem writes p as application/problem+json, with Retry-After when it has one.
func WriteProblem(w http.ResponseWriter, p Problem) {
	p.Type = "about:blank"
	p.Title = http.StatusText(p.Status)
	if p.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((p.RetryAfter+time.Second-1)/time.Second)))
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// WriteJSON writes v as JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
