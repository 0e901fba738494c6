package integration

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/integration/itest"
	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/raven"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

func hashLine(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// postWith posts one request for client with the given client and token (empty: none)
// and returns the status and problem code.
func postWith(t testing.TB, c *http.Client, url, token, client string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"clientId":"`+client+`"}`))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error(), nil
	}
	defer resp.Body.Close()
	var p struct{ Code, Detail string }
	_ = json.NewDecoder(resp.Body).Decode(&p)
	return resp.StatusCode, p.Code + " " + p.Detail, resp.Header
}

// Ingest takes bearer tokens from a file of hashes and from a setting, refuses everything
// else with the same 401, publishes nothing it refused, and picks up a rotated file
// without a restart. Tokens never reach its log.
func TestIngestBearerTokensAndRotation(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{noStart: true})
	const tokenB = "token-B-0123456789abcdef012345678" // INGEST_TOKEN takes 32 characters or more
	file := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(file, []byte("# penguin, 2026-11\n"+hashLine("token-A")+"  # old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, ops := freeAddr(t), freeAddr(t)
	p := startBin(t, ingestBin, map[string]string{"NATS_URL": s.srv.ClientURL(), "INGEST_ADDR": addr, "OPS_ADDR": ops,
		"INGEST_TOKENS_FILE": file, "INGEST_TOKEN": tokenB})
	waitReady(t, "http://"+addr) // probes need no token
	url := "http://" + addr + "/v1/requests"
	c := testHTTP

	var refusals []string
	for _, token := range []string{"", "token-X", "token-AA", "Token-A", "bearer"} {
		code, problem, h := postWith(t, c, url, token, "alice")
		if code != 401 || !strings.HasPrefix(problem, "unauthorized ") || !strings.HasPrefix(h.Get("WWW-Authenticate"), "Bearer") {
			t.Fatalf("token %q: %d %q, want 401 unauthorized with WWW-Authenticate", token, code, problem)
		}
		refusals = append(refusals, problem)
	}
	for _, r := range refusals[1:] {
		if r != refusals[0] {
			t.Fatalf("refusals differ (%q vs %q): the answer must not say why a token failed", r, refusals[0])
		}
	}
	for _, token := range []string{"token-A", tokenB} {
		if code, problem, _ := postWith(t, c, url, token, "alice"); code != 202 {
			t.Fatalf("token %q: %d %q, want 202", token, code, problem)
		}
	}
	if n := s.queued(); n != 2 {
		t.Fatalf("%d requests queued, want the 2 with valid tokens", n)
	}

	// Rotation: token-C in, token-A out, no restart.
	if err := os.WriteFile(file, []byte(hashLine("token-C")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the rotated token to be accepted", func() bool {
		code, _, _ := postWith(t, c, url, "token-C", "bob")
		return code == 202
	})
	if code, _, _ := postWith(t, c, url, "token-A", "bob"); code != 401 {
		t.Fatalf("the rotated-out token: %d, want 401", code)
	}
	// A broken file, or one left with no token (half written), keeps the tokens in force;
	// so does a plaintext token pasted in by mistake, which is not taken for a hash.
	for _, content := range []string{"token-C\n", "# nothing yet\n", strings.Repeat("ab", 32) + "\n"} {
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		kept := strings.Count(p.Output(), "keeping the tokens in force")
		waitFor(t, time.Minute, "ingest to look at the changed tokens file", func() bool {
			return strings.Count(p.Output(), "keeping the tokens in force") > kept
		})
		if code, _, _ := postWith(t, c, url, "token-C", "bob"); code != 202 {
			t.Fatalf("after a tokens file %q, token-C got %d, want 202 (tokens kept)", content, code)
		}
	}
	out := p.Output()
	for _, secret := range []string{"token-A", "token-B", "token-C", "token-X"} {
		if strings.Contains(out, secret) {
			t.Fatalf("ingest logged the token %q:\n%s", secret, out)
		}
	}
	if !strings.Contains(out, "cannot be used") {
		t.Fatalf("ingest did not log the broken tokens file:\n%s", out)
	}
}

// Ingest over mutual TLS with certificates made in the test: a client with a certificate
// from the CA gets in; one without, or speaking plain HTTP, does not.
func TestIngestMutualTLS(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{noStart: true})
	pki := queuetest.NewPKI(t)
	addr := freeAddr(t)
	startBin(t, ingestBin, map[string]string{"NATS_URL": s.srv.ClientURL(), "INGEST_ADDR": addr,
		"INGEST_TLS_CERT": pki.ServerCert, "INGEST_TLS_KEY": pki.ServerKey, "INGEST_TLS_CLIENT_CA": pki.CA})
	url := "https://" + addr + "/v1/requests"
	good := &http.Client{Transport: &http.Transport{TLSClientConfig: pki.ClientTLS(t)}, Timeout: 5 * time.Second}
	waitFor(t, time.Minute, "ingest over TLS", func() bool {
		resp, err := good.Get("https://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	if code, problem, _ := postWith(t, good, url, "", "alice"); code != 202 {
		t.Fatalf("client with a certificate: %d %q", code, problem)
	}
	noCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.Pool}}, Timeout: 5 * time.Second}
	if code, problem, _ := postWith(t, noCert, url, "", "alice"); code != 0 {
		t.Fatalf("client without a certificate got an answer: %d %q", code, problem)
	}
	if code, _, _ := postWith(t, testHTTP, "http://"+addr+"/v1/requests", "", "alice"); code == 202 {
		t.Fatal("plain HTTP was accepted")
	}
	if n := s.queued(); n != 1 {
		t.Fatalf("%d requests queued, want the 1 from the client with a certificate", n)
	}
}

// A client that sends its headers byte by byte (slowloris) is cut off, and good traffic
// beside it flows all the while.
func TestSlowClientIsCutOff(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{noStart: true})
	addr := freeAddr(t)
	startBin(t, ingestBin, map[string]string{"NATS_URL": s.srv.ClientURL(), "INGEST_ADDR": addr})
	waitReady(t, "http://"+addr)
	s.ingestURL = "http://" + addr + "/v1/requests"

	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	closed := make(chan time.Duration, 1)
	go func() {
		_, _ = io.WriteString(conn, "POST /v1/requests HTTP/1.1\r\nHost: x\r\n")
		for {
			if _, err := io.WriteString(conn, "X-Slow: a\r\n"); err != nil {
				break
			}
			time.Sleep(500 * time.Millisecond)
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
			if _, err := bufio.NewReader(conn).ReadByte(); err != nil && !isTimeout(err) {
				break // the server closed or answered and closed
			}
		}
		closed <- time.Since(start)
	}()
	for i := 0; ; i++ {
		select {
		case took := <-closed:
			// The header timeout is 5 s, the next one that could end it (the read
			// timeout) 30 s: the bound sits between them.
			if took > 15*time.Second {
				t.Fatalf("the slow client was cut off after %s, want at the 5s header timeout, long before the 30s read timeout", took)
			}
			if i < 3 {
				t.Fatalf("only %d good requests went through beside the slow client", i)
			}
			return
		default:
		}
		s.post(fmt.Sprintf("good-%d", i%3), i)
		time.Sleep(200 * time.Millisecond)
		if time.Since(start) > time.Minute {
			t.Fatal("the slow client was never cut off")
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Subject injection: clientIds that look like NATS subject syntax are ordinary clients,
// each on its own subject, never matching another's.
func TestSubjectSyntaxInClientIDsIsInert(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{noStart: true})
	ids := []string{"a.b", "a", "*", ">", "a.>", "a.*", "a b", "..", "a\\b", "$JS.API.STREAM.DELETE.REQUESTS"}
	for i, id := range ids {
		body, _ := json.Marshal(map[string]any{"clientId": id, "n": i})
		if a := s.postRaw(jsonHeader(), body); a.Status != 202 || a.str("clientId") != id {
			t.Fatalf("clientId %q: %d %v", id, a.Status, a.Body)
		}
		h := http.Header{"Content-Type": {"application/json"}, "X-Client-Id": {id}}
		if a := s.postRaw(h, []byte(`{}`)); a.Status != 202 || a.str("clientId") != id {
			t.Fatalf("X-Client-Id %q: %d %v", id, a.Status, a.Body)
		}
	}
	backlog, err := s.q.Backlog(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(backlog) != len(ids) {
		t.Fatalf("%d subjects for %d clientIds: %v", len(backlog), len(ids), backlog)
	}
	for subj, n := range backlog {
		if n != 2 || strings.Count(subj, ".") != 3 {
			t.Fatalf("subject %s holds %d (want 2) or has extra tokens", subj, n)
		}
	}
	if _, err := s.q.Stats(t.Context()); err != nil {
		t.Fatalf("the request stream is not there any more: %v", err)
	}
	s.startDispatcher()
	s.finish(10*time.Second, 0)
}

// The admin API over TLS with a certificate made in the test: its own token, verified
// server certificate, nothing in plain text.
func TestAdminAPIOverTLS(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{noStart: true})
	pki := queuetest.NewPKI(t)
	ops := freeAddr(t)
	startProc(t, map[string]string{"NATS_URL": s.srv.ClientURL(), "RAVEN_URL": s.ravenURL, "LEASE_TTL": "2s", "RAVEN_TIMEOUT": "1s",
		"OPS_ADDR": ops, "OPS_TLS_CERT": pki.ServerCert, "OPS_TLS_KEY": pki.ServerKey, "ADMIN_TOKEN": "admin-secret-0123456789abcdef01234"})
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.Pool}}, Timeout: 5 * time.Second}
	base := "https://" + ops
	waitFor(t, time.Minute, "the dispatcher's listener over TLS", func() bool {
		resp, err := c.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	call := func(c *http.Client, url, token string) int {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := call(c, base+"/admin/v1/steering", "admin-secret-0123456789abcdef01234"); code != 200 {
		t.Fatalf("admin call with the token over TLS: %d", code)
	}
	if code := call(c, base+"/admin/v1/steering", "not-it"); code != 401 {
		t.Fatalf("admin call with a wrong token: %d, want 401", code)
	}
	untrusting := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: x509.NewCertPool()}}, Timeout: 5 * time.Second}
	if code := call(untrusting, base+"/admin/v1/steering", "admin-secret-0123456789abcdef01234"); code != 0 {
		t.Fatalf("a client that cannot verify the certificate got %d", code)
	}
	if code := call(testHTTP, "http://"+ops+"/admin/v1/steering", "admin-secret-0123456789abcdef01234"); code == 200 {
		t.Fatal("the admin API answered over plain HTTP")
	}
}

// gatedPublisher holds each publish until the gate opens, then publishes for real.
type gatedPublisher struct {
	q       ingest.Publisher
	gate    chan struct{}
	waiting *atomic.Int64
}

func (g gatedPublisher) Publish(ctx context.Context, r request.Request) (request.Receipt, error) {
	g.waiting.Add(1)
	select {
	case <-g.gate:
	case <-ctx.Done():
		return request.Receipt{}, ctx.Err()
	}
	return g.q.Publish(ctx, r)
}

func (g gatedPublisher) PublishAll(ctx context.Context, rs []request.Request) ([]request.Receipt, []error) {
	g.waiting.Add(int64(len(rs)))
	select {
	case <-g.gate:
	case <-ctx.Done():
		errs := make([]error, len(rs))
		for i := range errs {
			errs[i] = ctx.Err()
		}
		return make([]request.Receipt, len(rs)), errs
	}
	return g.q.PublishAll(ctx, rs)
}

// With MAX_PUBLISHING publishes already waiting for JetStream, the next request gets 503
// overloaded at once (nothing held in memory), and the waiting ones complete.
func TestPublishesInFlightAreBounded(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{noStart: true})
	gate, waiting := make(chan struct{}), &atomic.Int64{}
	api, err := ingest.New(ingest.Config{MaxPublishing: 2}, gatedPublisher{q: s.q, gate: gate, waiting: waiting}, s.q, testLog())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open) // registered after the server's: a failure opens the gate before Close waits on the held publishes
	s.ingestURL = srv.URL + "/v1/requests"
	done := make(chan answer, 2)
	for i := range 2 {
		go func() {
			a, _ := s.tryPost(jsonHeader(), []byte(fmt.Sprintf(`{"clientId":"c%d"}`, i)))
			done <- a
		}()
	}
	waitFor(t, time.Minute, "two publishes to be waiting", func() bool { return waiting.Load() == 2 })
	if a := s.postRaw(jsonHeader(), []byte(`{"clientId":"third"}`)); a.Status != 503 || a.str("code") != "overloaded" || a.Header.Get("Retry-After") == "" {
		t.Fatalf("a third request while two publishes wait: %d %v, want 503 overloaded with Retry-After", a.Status, a.Body)
	}
	if w := waiting.Load(); w != 2 {
		t.Fatalf("%d publishes reached the queue, want the third refused before it", w)
	}
	open()
	for range 2 {
		if a := <-done; a.Status != 202 {
			t.Fatalf("a waiting publish ended %d %v", a.Status, a.Body)
		}
	}
	if a := s.postRaw(jsonHeader(), []byte(`{"clientId":"after"}`)); a.Status != 202 {
		t.Fatalf("after the gate opened: %d %v", a.Status, a.Body)
	}
	if n := s.queued(); n != 3 {
		t.Fatalf("%d queued, want the 3 accepted", n)
	}
}

// Raven's URL stays private when raven cannot be reached (issue 35, finding 4): with
// credentials and a key in RAVEN_URL and nothing listening there, the status penguin
// reads, the events, the dead letter's headers and the dispatcher's log lines say
// "connection_refused" and never carry the URL, its user, password or key.
func TestRavenURLStaysPrivate(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{interval: 50 * time.Millisecond, noStart: true, policy: schedule.Policy{MaxAttempts: 2}})
	closed := freeAddr(t)
	s.ravenURL = "http://svcuser:s3cret-pw@" + closed + "/hook?api_key=SECRET"
	s.startDispatcher()
	id := s.post("bob", 0)
	itest.WaitFor(t, time.Minute, "bob's request dead-lettered", func() bool { return len(s.dead()) == 1 })
	leaks := func(where, text string) {
		t.Helper()
		for _, secret := range []string{"SECRET", "s3cret", "svcuser", "/hook", "api_key"} {
			if strings.Contains(text, secret) {
				t.Errorf("%s carries raven's URL (%q): %s", where, secret, text)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := s.q.Status(ctx, "bob", id)
	if err != nil {
		t.Fatal(err)
	}
	if st.DeadLetter == nil || !strings.Contains(st.DeadLetter.LastError, raven.NoAnswerRefused) {
		t.Errorf("the status's dead letter: %+v, want its last error to say %s", st.DeadLetter, raven.NoAnswerRefused)
	}
	b, _ := json.Marshal(st)
	leaks("the status", string(b))
	events, err := s.q.Events(ctx, "bob", id)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = json.Marshal(events)
	leaks("the events", string(b))
	for d, err := range s.q.DeadLetters(ctx, queue.DeadFilter{ID: id}) {
		if err != nil {
			t.Fatal(err)
		}
		b, _ = json.Marshal(d.Headers)
		leaks("the dead letter's headers", string(b))
		b, _ = json.Marshal(d)
		leaks("the dead letter", string(b))
	}
	s.stopDispatcher()
	leaks("the dispatcher's log", s.dispatchLog.String())
	if !strings.Contains(s.dispatchLog.String(), raven.NoAnswerRefused) {
		t.Errorf("the dispatcher's log does not say %s:\n%s", raven.NoAnswerRefused, s.dispatchLog.String())
	}
}

// Two tenants behind one ingest, each with a token scoped to its clients (issue 35,
// findings 2 and 5): what the review did with token A to tenant B's clients is refused
// (sending for them, taking over an Idempotency-Key, parking the head for a week, filling
// the backlog, reading statuses), B's requests go on as if A did not exist, and one
// tenant cannot hold more clients with a backlog than its share.
func TestTenantsCannotReachEachOther(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{noStart: true})
	// No dispatcher runs: a queued request has no stored event (ADR 18), and the
	// dispatchers' lookup, served here as a dispatcher does, says it is queued.
	stopLookups, err := s.q.ServeQueuedLookups()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopLookups)
	file := filepath.Join(t.TempDir(), "tokens")
	lines := hashLine("token-A") + " tenant=alpha clients=alpha-*\n" +
		hashLine("token-B") + " tenant=beta clients=beta-*,bob-of-B backlogs=3\n"
	if err := os.WriteFile(file, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, ops := freeAddr(t), freeAddr(t)
	startBin(t, ingestBin, map[string]string{"NATS_URL": s.srv.ClientURL(), "INGEST_ADDR": addr, "OPS_ADDR": ops,
		"INGEST_TOKENS_FILE": file})
	waitReady(t, "http://"+addr)
	base := "http://" + addr + "/v1/requests"
	type answer struct {
		Code             int
		Problem, Detail  string
		ID, State        string
		Duplicate        bool
		Failed, Accepted int
	}
	do := func(method, url, token, body string, header ...string) answer {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := testHTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var raw map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&raw)
		a := answer{Code: resp.StatusCode}
		a.Problem, _ = raw["code"].(string)
		a.Detail, _ = raw["detail"].(string)
		a.ID, _ = raw["id"].(string)
		a.State, _ = raw["status"].(string)
		a.Duplicate, _ = raw["duplicate"].(bool)
		f, _ := raw["failed"].(float64)
		ac, _ := raw["accepted"].(float64)
		a.Failed, a.Accepted = int(f), int(ac)
		return a
	}
	// A takes over B's key, with its own body: refused, nothing stored.
	if a := do("POST", base, "token-A", `{"evil":1}`, "X-Client-Id", "bob-of-B", "Idempotency-Key", "order-1236"); a.Code != 403 || a.Problem != "client_not_allowed" {
		t.Errorf("A sending for B's client with B's key: %d %s %s, want 403 client_not_allowed", a.Code, a.Problem, a.Detail)
	}
	// A parks B's client for as long as it may (a week in the review; MAX_NOT_BEFORE is a
	// day now): refused.
	if a := do("POST", base, "token-A", `{}`, "X-Client-Id", "bob-of-B", "Not-Before", "86000"); a.Code != 403 {
		t.Errorf("A delaying B's client for a day: %d %s, want 403", a.Code, a.Problem)
	}
	// A fills B's backlog with a batch: every item refused.
	var batch strings.Builder
	for i := range 50 {
		fmt.Fprintf(&batch, `{"clientId":"beta-%d","body":{}}`+"\n", i%2)
	}
	if a := do("POST", base+"/batch", "token-A", batch.String(), "Content-Type", "application/x-ndjson"); a.Code != 200 || a.Failed != 50 || a.Accepted != 0 {
		t.Errorf("A's batch for B's clients: %d, %d failed and %d accepted, want all 50 failed", a.Code, a.Failed, a.Accepted)
	}
	if n := s.queued(); n != 0 {
		t.Fatalf("%d requests queued after A's attempts on B's clients, want none", n)
	}
	// B's own request with its key is B's, not a duplicate of A's.
	mine := do("POST", base, "token-B", `{"order":1236}`, "X-Client-Id", "bob-of-B", "Idempotency-Key", "order-1236")
	if mine.Code != 202 || mine.Duplicate {
		t.Fatalf("B's request after A's attempts: %d duplicate=%v %s, want 202 and not a duplicate", mine.Code, mine.Duplicate, mine.Detail)
	}
	// A reads B's status: as for an id never given. B reads it.
	waitFor(t, time.Minute, "B's request to be readable as queued", func() bool {
		return do("GET", base+"/"+mine.ID+"?clientId=bob-of-B", "token-B", "").State == string(request.StateQueued)
	})
	if a := do("GET", base+"/"+mine.ID+"?clientId=bob-of-B", "token-A", ""); a.Code != 200 || a.State != string(request.StateUnknown) {
		t.Errorf("A reading B's request: %d %s, want 200 unknown", a.Code, a.State)
	}
	// B's key again with another body: 409; the first stands.
	if a := do("POST", base, "token-B", `{"order":9999}`, "X-Client-Id", "bob-of-B", "Idempotency-Key", "order-1236"); a.Code != 409 || a.Problem != "idempotency_key_reused" {
		t.Errorf("B's key again with another body: %d %s, want 409 idempotency_key_reused", a.Code, a.Problem)
	}
	// B's share of clients with a backlog is 3: bob-of-B and two more; a fourth waits.
	for _, c := range []string{"beta-1", "beta-2"} {
		if a := do("POST", base, "token-B", `{}`, "X-Client-Id", c); a.Code != 202 {
			t.Fatalf("B's request for %s: %d %s", c, a.Code, a.Detail)
		}
	}
	if a := do("POST", base, "token-B", `{}`, "X-Client-Id", "beta-3", "Not-Before", "86000"); a.Code != 429 || a.Problem != "tenant_backlogs_full" {
		t.Errorf("B's fourth client with a backlog: %d %s, want 429 tenant_backlogs_full", a.Code, a.Problem)
	}
	if n := s.queued(); n != 3 {
		t.Errorf("%d requests queued, want B's 3", n)
	}
}
