package ingest_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/fault"
	"github.com/penguinhq/dispatcher/pkg/httpapi"
	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
)

// While NATS takes the connection but answers nothing (a partition, or a cluster
// electing a stream's leader), /readyz still answers within its bound: 503 "cannot
// tell", not a silence that a probe's timeout takes for a dead process; /healthz answers
// at once. The bound is httpapi.ReadyTimeout; the test allows a busy machine four times
// that: the 2 s of the probes that found /readyz silent (it used to wait up to 2 s).
func TestReadyAnswersWhileNATSIsSilent(t *testing.T) {
	srv := queuetest.Server(t)
	proxy, err := fault.New(strings.TrimPrefix(srv.ClientURL(), "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	conn, err := queue.Connect("nats://"+proxy.Addr(), "test", zerolog.Nop(), queue.Security{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	q, err := conn.Open(context.Background(), queue.Config{}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	api, err := ingest.New(ingest.Config{}, q, q, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(api.Handler())
	t.Cleanup(hs.Close)
	client := &http.Client{Timeout: 10 * time.Second} // longer than any hang the test looks for
	get := func(path string) (int, string, time.Duration) {
		t.Helper()
		began := time.Now()
		resp, err := client.Get(hs.URL + path)
		if err != nil {
			t.Fatalf("GET %s: %v after %s", path, err, time.Since(began))
		}
		defer resp.Body.Close()
		var p httpapi.Problem
		_ = json.NewDecoder(resp.Body).Decode(&p)
		return resp.StatusCode, p.Detail, time.Since(began)
	}
	// Ready while NATS answers: on a loaded machine one check may not finish within its
	// half second ("cannot tell"), so the test asks until one does (a bound on a hang).
	for began := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		code, detail, _ := get("/readyz")
		if code == http.StatusOK {
			break
		}
		if time.Since(began) > 30*time.Second {
			t.Fatalf("/readyz answered %d (%s) with NATS reachable for 30 s, want 200", code, detail)
		}
	}

	proxy.Blackhole()
	// Each answer comes within the bound (5 s, ten times ReadyTimeout, allows a busy machine
	// and still tells a check that waits on the silent NATS); the last answer
	// (ready) may stand for ReadyStale while the check is late, then it cannot tell.
	const within = 5 * time.Second
	deadline := time.Now().Add(httpapi.ReadyStale + 10*time.Second)
	for cannotTell := 0; cannotTell < 2; {
		code, detail, took := get("/readyz")
		switch {
		case took > within:
			t.Fatalf("/readyz answered after %s with NATS silent, want within %s (bound %s)", took, within, httpapi.ReadyTimeout)
		case code == http.StatusServiceUnavailable && strings.HasPrefix(detail, "cannot tell:"):
			cannotTell++
		case code == http.StatusOK && cannotTell == 0:
			// the last check's answer, while the next one is late
		default:
			t.Fatalf("/readyz answered %d %q after %s with NATS silent, want 503 \"cannot tell: ...\" (or, for %s, the last answer)", code, detail, took, httpapi.ReadyStale)
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still did not say it cannot tell %s after NATS fell silent", httpapi.ReadyStale+10*time.Second)
		}
	}
	if code, _, took := get("/healthz"); code != http.StatusOK || took > within {
		t.Fatalf("/healthz answered %d after %s with NATS silent, want 200 at once", code, took)
	}

	proxy.Heal()
	deadline = time.Now().Add(20 * time.Second)
	for {
		code, _, _ := get("/readyz")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still %d 20s after NATS answered again", code)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
