package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"
)

// Readiness logs changes only, and a start (not ready before the first ready answer) is
// not a warning; losing readiness after it is.
func TestReadyLogsChangesAndStartIsNoWarning(t *testing.T) {
	var buf bytes.Buffer
	var failing error = errors.New("starting")
	h := Ready(func(context.Context) error { return failing }, "not ready", zerolog.New(&buf))
	probe := func() int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code
	}
	for range 3 {
		if probe() != http.StatusServiceUnavailable {
			t.Fatal("not 503 while not ready")
		}
	}
	failing = nil
	if probe() != http.StatusOK {
		t.Fatal("not 200 when ready")
	}
	failing = errors.New("store full")
	probe()
	probe()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{`"level":"info"`, `"message":"ready"`, `"level":"warn"`}
	if len(lines) != 3 {
		t.Fatalf("log lines %q, want three: not ready yet (info), ready, not ready (warn)", lines)
	}
	for i, w := range want {
		if !strings.Contains(lines[i], w) {
			t.Errorf("line %d %q, want %s", i, lines[i], w)
		}
	}
}

// Readiness answers within ReadyTimeout while its check waits on a NATS that does not
// answer: a check that waits for its context (as a NATS request does) and one that
// overlooks it alike. The answer is 503 "cannot tell", and probes that come while the
// check hangs start no second one. (In a synctest bubble: the bound is exact.)
func TestReadyAnswersWithinItsBound(t *testing.T) {
	probe := func(h http.Handler) (int, string, time.Duration) {
		began := time.Now()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		var p Problem
		_ = json.Unmarshal(rec.Body.Bytes(), &p)
		return rec.Code, p.Detail, time.Since(began)
	}
	t.Run("CheckHonoursItsContext", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			h := Ready(func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }, "not ready", zerolog.Nop())
			code, detail, took := probe(h)
			if code != http.StatusServiceUnavailable || !strings.HasPrefix(detail, "cannot tell:") || took > ReadyTimeout {
				t.Fatalf("answered %d %q after %s; want 503 \"cannot tell: ...\" within %s", code, detail, took, ReadyTimeout)
			}
			time.Sleep(ReadyCheckTimeout) // the check gives up by its own deadline
		})
	})
	t.Run("CheckOverlooksItsContext", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			release := make(chan struct{})
			var checks atomic.Int32
			h := Ready(func(context.Context) error { checks.Add(1); <-release; return nil }, "not ready", zerolog.Nop())
			for range 3 {
				code, detail, took := probe(h)
				if code != http.StatusServiceUnavailable || !strings.HasPrefix(detail, "cannot tell:") || took > ReadyTimeout {
					t.Fatalf("answered %d %q after %s; want 503 \"cannot tell: ...\" within %s", code, detail, took, ReadyTimeout)
				}
			}
			if n := checks.Load(); n != 1 {
				t.Fatalf("%d checks ran for probes that came while one hung; want 1", n)
			}
			close(release) // NATS answers again: the next probe starts a check that passes
			synctest.Wait()
			if code, _, _ := probe(h); code != http.StatusOK {
				t.Fatalf("answered %d once the check passes again, want 200", code)
			}
		})
	})
}

// A check slower than the answer's bound (NATS slow on a loaded machine) does not make
// readiness flap: while the next check is late, the last one's answer stands for
// ReadyStale; only after that, or with no answer yet, does readiness say it cannot tell.
func TestReadyDoesNotFlapWhileChecksAreSlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := Ready(func(ctx context.Context) error {
			time.Sleep(800 * time.Millisecond) // slower than ReadyTimeout, well inside ReadyCheckTimeout
			return nil
		}, "not ready", zerolog.Nop())
		call := func() int {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			return rec.Code
		}
		if code := call(); code != http.StatusServiceUnavailable {
			t.Fatalf("first probe, no check finished yet: %d, want 503 (cannot tell)", code)
		}
		time.Sleep(time.Second) // the first check finishes, ready
		for i := range 3 {
			if code := call(); code != http.StatusOK {
				t.Fatalf("probe %d while a slow check runs, the last one ready a moment ago: %d, want 200", i, code)
			}
			time.Sleep(time.Second)
		}
	})
}
