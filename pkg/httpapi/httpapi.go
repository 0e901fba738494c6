// Package httpapi holds what the service's HTTP APIs share: RFC 9457 problem details
// and JSON answers, 405 answers with their Allow header, and bearer tokens.
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	_ = encoder(w).Encode(p)
}

// WriteJSON writes v as JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = encoder(w).Encode(v)
}

// encoder writes JSON answers as they read: "<token>" in a detail stays "<token>", not
// "\u003ctoken\u003e". encoding/json escapes <, > and & by default, for JSON embedded in
// HTML; these answers are served as JSON, never inside a page, and every string is still
// escaped as JSON requires.
func encoder(w http.ResponseWriter) *json.Encoder {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc
}

// ReadyTimeout bounds every readiness answer. A check that needs NATS (is the queue
// reachable, are its streams in place) can wait on a server that is electing a leader or
// does not answer at all; a probe must not wait with it, or its own timeout (often 1 to
// 3 s) takes the silence for a dead process. Past the bound, readiness is the last
// check's answer if that is at most ReadyStale old, else "cannot tell", answered as not
// ready.
const ReadyTimeout = 500 * time.Millisecond

// ReadyCheckTimeout is how long a readiness check itself may take. It is longer than the
// answer's bound: on a loaded machine a check slower than ReadyTimeout still finishes and
// its answer counts, so that readiness does not flap to "cannot tell" (and a Kubernetes
// Service drop the instance) whenever NATS is slow.
const ReadyCheckTimeout = 5 * time.Second

// ReadyStale is how old the last check's answer may be and still be given while the next
// check is late: beyond it, readiness cannot tell.
const ReadyStale = 3 * time.Second

// ErrCannotTell is the cause of a bounded check (Bounded) that did not finish within its
// bound: whether the service is ready is not known, and it says it is not.
var ErrCannotTell = errors.New("cannot tell")

// Bounded returns check bounded to answer within d. The check runs in a goroutine of its
// own with a deadline of ReadyCheckTimeout, so that even a check that overlooks its
// context is answered within d; a call that comes while a check runs waits for that one
// (at most d too) instead of starting another, so that probes that pile up against a
// silent NATS start one check at a time. When the check has not finished within d, the
// answer is that of the last check that finished, if it finished at most ReadyStale ago;
// otherwise, and when the check failed once its deadline had passed, an error wrapping
// ErrCannotTell. A caller whose ctx ends first gets ctx's error.
//
// The check's context carries none of the caller's values: it is shared by the callers
// that come while it runs.
func Bounded(check func(ctx context.Context) error, d time.Duration) func(ctx context.Context) error {
	type run struct {
		done chan struct{} // closed once err is set
		err  error
	}
	var (
		mu      sync.Mutex
		running *run // the check in flight; nil when none
		last    error
		lastAt  time.Time // when the last check finished; zero before the first
	)
	return func(ctx context.Context) error {
		mu.Lock()
		c := running
		if c == nil {
			c = &run{done: make(chan struct{})}
			running = c
			go func() {
				cctx, cancel := context.WithTimeout(context.Background(), max(d, ReadyCheckTimeout))
				defer cancel()
				err := check(cctx)
				if err != nil && cctx.Err() != nil {
					// Failed once its deadline passed: for that, whatever error
					// the client library made of it (a context error, a timeout).
					err = fmt.Errorf("%w: no answer within %s: %w", ErrCannotTell, max(d, ReadyCheckTimeout), err)
				}
				mu.Lock()
				running, last, lastAt = nil, err, time.Now()
				mu.Unlock()
				c.err = err
				close(c.done)
			}()
		}
		mu.Unlock()
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-c.done:
			return c.err
		case <-t.C:
			mu.Lock()
			err, at := last, lastAt
			mu.Unlock()
			if !at.IsZero() && time.Since(at) <= ReadyStale {
				return err // the last answer, while the next one is late
			}
			return fmt.Errorf("%w: the check did not finish within %s", ErrCannotTell, d)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Ready answers /readyz within ReadyTimeout: 200 while check passes, else 503 not_ready
// with detail, or, when the check did not finish within the bound, with a detail that
// starts "cannot tell:". The cause goes to the log, not to whoever asks, and only when
// readiness changes (a probe every second must not write a line every second; the part
// that failed logs its own changes of cause). Not ready before the first ready answer is
// a start, not a warning.
func Ready(check func(ctx context.Context) error, detail string, log zerolog.Logger) http.Handler {
	bounded := Bounded(check, ReadyTimeout)
	cannotTell := fmt.Sprintf("cannot tell: the check did not finish within %s (NATS slow to answer, or electing a leader); not ready until it does", ReadyTimeout)
	var mu sync.Mutex
	notReady, wasReady := false, false
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := bounded(r.Context())
		if r.Context().Err() != nil {
			return // the prober left: nothing to answer, and nothing learnt
		}
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
		switch {
		case errors.Is(err, ErrCannotTell):
			WriteProblem(w, Problem{Status: http.StatusServiceUnavailable, Code: "not_ready", RetryAfter: time.Second, Detail: cannotTell})
		case err != nil:
			WriteProblem(w, Problem{Status: http.StatusServiceUnavailable, Code: "not_ready", RetryAfter: time.Second, Detail: detail})
		default:
			WriteJSON(w, http.StatusOK, map[string]string{"status": "ready"})
		}
	})
}
