package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// Every kind of bad input gets the right 4xx as problem+json with a detail, nothing of it
// is published, and good traffic beside it is unharmed.
func TestBadInputIsRefusedAndNotPublished(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{noStart: true}) // nothing is dispatched, so the queue shows all that was published
	s.post("good", 0)

	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Add(kv[i], kv[i+1])
		}
		return out
	}
	jsonCT := "application/json"
	cases := []struct {
		name   string
		header http.Header
		body   string
		status int
		code   string
	}{
		{"MalformedJSON", h("Content-Type", jsonCT), `{"clientId":"a",`, 400, "malformed_json"},
		{"EmptyBody", h("Content-Type", jsonCT), ``, 400, "malformed_json"},
		{"TrailingGarbage", h("Content-Type", jsonCT), `{"clientId":"a"} x`, 400, "malformed_json"},
		{"ClientIDMissing", h("Content-Type", jsonCT), `{"n":1}`, 400, "client_id_missing"},
		{"ClientIDNested", h("Content-Type", jsonCT), `{"x":{"clientId":"a"}}`, 400, "client_id_missing"},
		{"BodyNotObject", h("Content-Type", jsonCT), `["clientId","a"]`, 400, "client_id_missing"},
		{"ClientIDNumber", h("Content-Type", jsonCT), `{"clientId":42}`, 400, "client_id_invalid"},
		{"ClientIDNull", h("Content-Type", jsonCT), `{"clientId":null}`, 400, "client_id_invalid"},
		{"ClientIDArray", h("Content-Type", jsonCT), `{"clientId":["a"]}`, 400, "client_id_invalid"},
		{"ClientIDObject", h("Content-Type", jsonCT), `{"clientId":{"a":1}}`, 400, "client_id_invalid"},
		{"ClientIDDuplicateKey", h("Content-Type", jsonCT), `{"clientId":"a","clientId":"b"}`, 400, "client_id_invalid"},
		{"ClientIDEmpty", h("Content-Type", jsonCT), `{"clientId":""}`, 400, "client_id_invalid"},
		{"ClientIDEmptyHeader", h("Content-Type", jsonCT, "X-Client-Id", ""), `{}`, 400, "client_id_invalid"},
		{"ClientIDTooLong", h("Content-Type", jsonCT), `{"clientId":"` + strings.Repeat("x", 129) + `"}`, 400, "client_id_invalid"},
		{"ClientIDTooLongHeader", h("Content-Type", jsonCT, "X-Client-Id", strings.Repeat("é", 65)), `{}`, 400, "client_id_invalid"},
		{"ClientIDControlChar", h("Content-Type", jsonCT), `{"clientId":"a\u0001b"}`, 400, "client_id_invalid"},
		{"ClientIDLoneSurrogate", h("Content-Type", jsonCT), `{"clientId":"a\ud800"}`, 400, "client_id_invalid"},
		{"ClientIDNewline", h("Content-Type", jsonCT), `{"clientId":"a\nb"}`, 400, "client_id_invalid"},
		{"ClientIDInvalidUTF8", h("Content-Type", jsonCT), "{\"clientId\":\"a\xffb\"}", 400, "client_id_invalid"},
		{"ClientIDInvalidUTF8Header", h("Content-Type", jsonCT, "X-Client-Id", "a\xffb"), `{}`, 400, "client_id_invalid"},
		{"TwoClientIDHeaders", h("Content-Type", jsonCT, "X-Client-Id", "a", "X-Client-Id", "b"), `{}`, 400, "client_id_invalid"},
		{"IdempotencyKeyControl", h("Content-Type", jsonCT, "Idempotency-Key", "a\tb"), `{"clientId":"a"}`, 400, "idempotency_key_invalid"},
		{"IdempotencyKeyTooLong", h("Content-Type", jsonCT, "Idempotency-Key", strings.Repeat("k", 257)), `{"clientId":"a"}`, 400, "idempotency_key_invalid"},
		{"TooLarge", h("Content-Type", jsonCT), `{"clientId":"a","pad":"` + strings.Repeat("p", 4096) + `"}`, 413, "body_too_large"},
		{"OneByteOverTheLimit", h("Content-Type", jsonCT), `{"clientId":"a","pad":"` + strings.Repeat("p", 4096-len(`{"clientId":"a","pad":""}`)+1) + `"}`, 413, "body_too_large"},
		{"NotJSON", h("Content-Type", "text/plain"), `{"clientId":"a"}`, 415, "unsupported_media_type"},
		{"NoContentType", h(), `{"clientId":"a"}`, 415, "unsupported_media_type"},
		// A Content-Type too long to be stored beside a body of MAX_BODY_BYTES: refused,
		// not a 503 for ever.
		{"LongContentType", h("Content-Type", "application/json; x="+strings.Repeat("y", 300)), `{"clientId":"a"}`, 415, "unsupported_media_type"},
		{"DeeplyNested", h("Content-Type", jsonCT), `{"clientId":"a","x":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`, 413, "body_too_large"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := s.postRaw(c.header, []byte(c.body))
			if a.Status != c.status || a.str("code") != c.code {
				t.Fatalf("got %d %q, want %d %q: %v", a.Status, a.str("code"), c.status, c.code, a.Body)
			}
			if ct := a.Header.Get("Content-Type"); ct != "application/problem+json" {
				t.Fatalf("Content-Type %q, want application/problem+json", ct)
			}
			if len(a.str("detail")) < 10 || a.Body["status"] != float64(c.status) {
				t.Fatalf("problem %v lacks a useful detail or status", a.Body)
			}
		})
	}
	// A body exactly at the limit is accepted.
	atLimit := `{"clientId":"a","pad":"` + strings.Repeat("p", 4096-len(`{"clientId":"a","pad":""}`)) + `"}`
	if a := s.postRaw(h("Content-Type", jsonCT), []byte(atLimit)); a.Status != 202 {
		t.Fatalf("a body of exactly the limit (%d bytes): %d %v", len(atLimit), a.Status, a.Body)
	}
	// Deep nesting within the size limit is refused by the JSON parser, not a crash.
	deep := `{"clientId":"a","x":` + strings.Repeat("[", 1990) + strings.Repeat("]", 1990) + `}`
	if a := s.postRaw(h("Content-Type", jsonCT), []byte(deep)); a.Status != 202 && a.Status != 400 {
		t.Fatalf("deep nesting: %d %v", a.Status, a.Body)
	}
	s.post("good", 1)
	if got, want := s.queued(), s.acceptedCount(); got != want {
		t.Fatalf("queue holds %d requests, want only the %d accepted ones", got, want)
	}
	s.startDispatcher()
	s.finish(10*time.Second, 0)
}

// A client at its backlog cap gets 429 with Retry-After; what it had queued stays and is
// delivered, and other clients are not affected (G8).
func TestBacklogCapAnswers429(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{noStart: true, queue: queue.Config{BacklogCap: 3}})
	for n := range 3 {
		s.post("full", n)
	}
	a := s.postRaw(jsonHeader(), []byte(`{"clientId":"full","n":3}`))
	if a.Status != http.StatusTooManyRequests || a.str("code") != "backlog_full" {
		t.Fatalf("fourth request: %d %v, want 429 backlog_full", a.Status, a.Body)
	}
	if ra, err := strconv.Atoi(a.Header.Get("Retry-After")); err != nil || ra < 1 {
		t.Fatalf("Retry-After %q, want a positive number of seconds", a.Header.Get("Retry-After"))
	}
	s.post("other", 0)
	s.startDispatcher()
	rep := s.finish(10*time.Second, 0)
	if rep.Delivered != 4 {
		t.Fatalf("delivered %d, want the 3 queued before the cap and the other client's 1", rep.Delivered)
	}
}

// A full stream answers 503 with Retry-After, and what is queued stays (G8).
func TestFullQueueAnswers503(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{noStart: true, queue: queue.Config{MaxBytes: 8 << 10}})
	var a answer
	for n := 0; n < 200; n++ {
		if a = s.postRaw(jsonHeader(), []byte(`{"clientId":"c`+strconv.Itoa(n)+`","pad":"`+strings.Repeat("p", 400)+`"}`)); a.Status != 202 {
			break
		}
	}
	if a.Status != http.StatusServiceUnavailable || a.str("code") != "queue_full" || a.Header.Get("Retry-After") == "" {
		t.Fatalf("past the stream's size: %d %v (Retry-After %q), want 503 queue_full with Retry-After", a.Status, a.Body, a.Header.Get("Retry-After"))
	}
	if s.acceptedCount() == 0 {
		t.Fatal("nothing was accepted before the stream filled")
	}
	s.startDispatcher()
	s.finish(20*time.Second, 0)
}

// With JetStream gone, ingest answers 503 with Retry-After and readyz says not ready;
// nothing is acknowledged that was not stored (G1).
func TestNATSDownAnswers503(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{noStart: true})
	readyz := strings.TrimSuffix(s.ingestURL, "/v1/requests") + "/readyz"
	// One check may not finish within its half second on a loaded machine ("cannot
	// tell"): ready is asked for until it comes.
	waitForState(t, 30*time.Second, "readyz 200 with NATS up", func() (bool, string) {
		code := get(t, readyz)
		return code == 200, fmt.Sprint(code)
	})
	s.post("a", 0)
	s.stopNATS()
	waitFor(t, time.Minute, "the client to notice NATS is gone", func() bool { return !s.nc.IsConnected() })
	a := s.postRaw(jsonHeader(), []byte(`{"clientId":"a","n":1}`))
	if a.Status != http.StatusServiceUnavailable || a.Header.Get("Retry-After") == "" || a.str("code") != "queue_unavailable" {
		t.Fatalf("with NATS down: %d %v, want 503 queue_unavailable with Retry-After", a.Status, a.Body)
	}
	if code := get(t, readyz); code != http.StatusServiceUnavailable {
		t.Fatalf("readyz %d with NATS down, want 503", code)
	}
	if code := get(t, strings.TrimSuffix(s.ingestURL, "/v1/requests")+"/healthz"); code != 200 {
		t.Fatalf("healthz %d, want 200: the process is alive", code)
	}

	// NATS comes back: ingest accepts again, and the request accepted before the outage
	// is delivered (and the refused one is not).
	s.restartNATS()
	waitFor(t, time.Minute, "readyz", func() bool { return get(t, readyz) == 200 })
	s.post("a", 2)
	s.startDispatcher()
	if rep := s.finish(10*time.Second, 0); rep.Delivered != 2 || rep.Arrivals != 2 {
		t.Fatalf("report %s, want the 2 accepted requests delivered", rep)
	}
}

func get(t testing.TB, url string) int {
	t.Helper()
	resp, err := testHTTP.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A message that did not come through ingest, on a subject with no valid clientId token,
// is moved to the dead-letter stream unsent instead of stalling its lane; the other
// clients are not affected.
func TestUndecodableSubjectIsDeadLettered(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{})
	msg := nats.NewMsg("dispatch.req.not!base64")
	msg.Header.Set("Dispatch-Id", "raw-1")
	msg.Data = []byte(`{}`)
	if _, err := s.nc.RequestMsg(msg, 5*time.Second); err != nil {
		t.Fatalf("publishing a raw message: %v", err)
	}
	s.post("a", 0)
	s.post("a", 1)
	rep := s.finish(10*time.Second, 0)
	recs := s.deadLetters()
	if rep.Delivered != 2 || rep.Arrivals != 2 || len(recs) != 1 || recs[0].ID != "raw-1" || recs[0].Reason != request.ReasonUndecodable {
		t.Fatalf("report %s, dead letters %+v: want both good requests delivered and the raw one dead-lettered as undecodable", rep, recs)
	}
}

// rawExchange writes raw bytes to addr and returns what comes back before the server
// closes or wait passes.
func rawExchange(t testing.TB, addr, raw string, wait time.Duration) string {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(raw)); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(wait))
	got, _ := io.ReadAll(conn)
	return string(got)
}

// A body shorter than its Content-Length: the caller gets 408 problem+json once the
// body timeout passes (here 300 ms), not after the server's whole read timeout, and
// nothing is stored. Without the body's own deadline this request would wait for as long
// as the connection stays open.
func TestShortBodyGets408(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{noStart: true})
	api, err := ingest.New(ingest.Config{BodyTimeout: 300 * time.Millisecond}, s.q, s.q, testLog())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	got := rawExchange(t, strings.TrimPrefix(srv.URL, "http://"), "POST /v1/requests HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
		"Content-Length: 100\r\n\r\n"+`{"clientId":"short"`, 20*time.Second)
	if !strings.HasPrefix(got, "HTTP/1.1 408") || !strings.Contains(got, "application/problem+json") || !strings.Contains(got, `"code":"body_timeout"`) {
		t.Fatalf("answer %q, want 408 problem+json body_timeout", got)
	}
	if n := s.queued(); n != 0 {
		t.Fatalf("%d requests stored", n)
	}
}

// Refusals Go's HTTP server makes before the handler sees the request are plain text, as
// the README says: a header value with a NUL byte gets 400. Nothing is stored.
func TestMalformedHeaderIsRefusedByTheServer(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{noStart: true})
	got := rawExchange(t, strings.TrimPrefix(strings.TrimSuffix(s.ingestURL, "/v1/requests"), "http://"),
		"POST /v1/requests HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Client-Id: a\x00b\r\nContent-Length: 2\r\n\r\n{}", 5*time.Second)
	if !strings.HasPrefix(got, "HTTP/1.1 400") {
		t.Fatalf("answer %q, want the server's 400", got)
	}
	if n := s.queued(); n != 0 {
		t.Fatalf("%d requests stored", n)
	}
}
