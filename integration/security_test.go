package integration

import (
	"bufio"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
)

func hashLine(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// postWith posts one request for client with the given client and token (empty: none)
// and returns the status and problem code.
func postWith(t *testing.T, c *http.Client, url, token, client string) (int, string, http.Header) {
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
	file := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(file, []byte("# penguin, 2026-11\n"+hashLine("token-A")+"  # old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, ops := freeAddr(t), freeAddr(t)
	p := startBin(t, ingestBin, map[string]string{"NATS_URL": s.srv.ClientURL(), "INGEST_ADDR": addr, "OPS_ADDR": ops,
		"INGEST_TOKENS_FILE": file, "INGEST_TOKEN": "token-B"})
	waitReady(t, "http://"+addr) // probes need no token
	url := "http://" + addr + "/v1/requests"
	c := http.DefaultClient

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
	for _, token := range []string{"token-A", "token-B"} {
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
	waitFor(t, 15*time.Second, "the rotated token to be accepted", func() bool {
		code, _, _ := postWith(t, c, url, "token-C", "bob")
		return code == 202
	})
	if code, _, _ := postWith(t, c, url, "token-A", "bob"); code != 401 {
		t.Fatalf("the rotated-out token: %d, want 401", code)
	}
	// A broken file keeps the tokens in force.
	if err := os.WriteFile(file, []byte("token-C\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(6 * time.Second)
	if code, _, _ := postWith(t, c, url, "token-C", "bob"); code != 202 {
		t.Fatalf("after a broken tokens file, token-C got %d, want 202 (tokens kept)", code)
	}
	out := p.out.String()
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
	waitFor(t, 20*time.Second, "ingest over TLS", func() bool {
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
	if code, _, _ := postWith(t, http.DefaultClient, "http://"+addr+"/v1/requests", "", "alice"); code == 202 {
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
			if took > 8*time.Second {
				t.Fatalf("the slow client was cut off after %s, want within the 5s header timeout (and a little)", took)
			}
			if i < 3 {
				t.Fatalf("only %d good requests went through beside the slow client", i)
			}
			return
		default:
		}
		s.post(fmt.Sprintf("good-%d", i%3), i)
		time.Sleep(200 * time.Millisecond)
		if time.Since(start) > 20*time.Second {
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
