package httpapi

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

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
