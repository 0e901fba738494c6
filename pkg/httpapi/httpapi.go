// Package httpapi holds what the service's HTTP APIs share: RFC 9457 problem details
// and JSON answers.
package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"
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

// Ready answers /readyz: 200 while check passes, else 503 not_ready with detail. The
// cause goes to the log, not to whoever asks, and only when readiness changes (a probe
// every second must not write a line every second; the part that failed logs its own
// changes of cause). Not ready before the first ready answer is a start, not a warning.
func Ready(check func(ctx context.Context) error, detail string, log zerolog.Logger) http.Handler {
	var mu sync.Mutex
	notReady, wasReady := false, false
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		err := check(ctx)
		mu.Lock()
		switch {
		case err != nil && !notReady && !wasReady:
			notReady = true
			log.Info().Err(err).Msg("not ready yet")
		case err != nil && !notReady:
			notReady = true
			log.Warn().Err(err).Msg("not ready")
		case err == nil && notReady:
			notReady = false
			if wasReady {
				log.Info().Msg("ready again")
			} else {
				log.Info().Msg("ready")
			}
		}
		if err == nil {
			wasReady = true
		}
		mu.Unlock()
		if err != nil {
			WriteProblem(w, Problem{Status: http.StatusServiceUnavailable, Code: "not_ready", RetryAfter: time.Second, Detail: detail})
			return
		}
		WriteJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
}
