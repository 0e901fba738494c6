package cli

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/httpapi"
)

// While the readiness check waits on a NATS that does not answer, the operators'
// listener still answers within httpapi.ReadyTimeout: /readyz with 503, a scrape with
// dispatch_ready 0; /healthz asks nothing of NATS. (In a synctest bubble: the bound is
// exact.)
func TestOpsAnswersWhileNATSIsSilent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var checks atomic.Int32
		silent := func(ctx context.Context) error { checks.Add(1); <-ctx.Done(); return ctx.Err() }
		h := OpsHandler(prometheus.NewRegistry(), silent, nil, nil, zerolog.Nop())
		get := func(path string) (int, string, time.Duration) {
			began := time.Now()
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			b, _ := io.ReadAll(rec.Body)
			return rec.Code, string(b), time.Since(began)
		}
		if code, _, took := get("/healthz"); code != http.StatusOK || took != 0 || checks.Load() != 0 {
			t.Fatalf("/healthz: %d after %s, %d readiness checks; want 200 at once, none", code, took, checks.Load())
		}
		if code, body, took := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "cannot tell:") || took > httpapi.ReadyTimeout {
			t.Fatalf("/readyz: %d %s after %s; want 503 cannot tell within %s", code, body, took, httpapi.ReadyTimeout)
		}
		if code, body, took := get("/metrics"); code != http.StatusOK || !strings.Contains(body, "\ndispatch_ready 0\n") || took > httpapi.ReadyTimeout {
			t.Fatalf("/metrics: %d after %s, dispatch_ready 0 in it: %t; want 200 with it, within %s", code, took, strings.Contains(body, "\ndispatch_ready 0\n"), httpapi.ReadyTimeout)
		}
		time.Sleep(httpapi.ReadyCheckTimeout) // the silent checks give up by their own deadline
	})
}
