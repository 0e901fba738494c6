package ingest_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// tokensFile writes a tokens file of the lines given, each "token fields...": the token
// is written as its hash, the fields as they are.
func tokensFile(t *testing.T, lines ...string) string {
	t.Helper()
	var b strings.Builder
	for _, l := range lines {
		tok, fields, _ := strings.Cut(l, " ")
		sum := sha256.Sum256([]byte(tok))
		fmt.Fprintf(&b, "sha256:%s %s\n", hex.EncodeToString(sum[:]), fields)
	}
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestTokensFileScopes(t *testing.T) {
	t.Parallel()
	good := [][]string{
		{"a tenant=acme clients=acme-*", "b tenant=globex clients=globex-1,globex-2 delayed=5 backlogs=3 reads=2", "c"},
		{"a tenant=acme clients=acme-*", "a2 tenant=acme clients=acme-*"}, // a token being rotated
	}
	for _, lines := range good {
		if _, err := ingest.NewTokens(tokensFile(t, lines...), nil); err != nil {
			t.Errorf("%q: %v", lines, err)
		}
	}
	bad := map[string][]string{
		"unknown":               {"a tenant=acme clients=acme-* colour=blue"},
		"names its tenant":      {"a clients=acme-*"},
		"name its clients":      {"a tenant=acme"},
		"tenant":                {"a tenant=ac/me clients=x"},
		"a whole number":        {"a tenant=acme clients=x delayed=0"},
		"given twice":           {"a tenant=acme tenant=acme clients=x"},
		"another scope":         {"a tenant=acme clients=acme-*", "b tenant=acme clients=*"},
		"not name=value":        {"a tenant"},
		"clients pattern":       {"a tenant=acme clients=acme-*,"},
		"with * for any run of": {"a tenant=acme clients=a\x01"},
	}
	for want, lines := range bad {
		_, err := ingest.NewTokens(tokensFile(t, lines...), nil)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "line") {
			t.Errorf("%q: error %v, want one naming the line and saying %q", lines, err, want)
		}
	}
}

// scopedIngest is ingest on a real queue with tokens for two tenants, acme and globex,
// and one unscoped token; small shares for globex.
func scopedIngest(t *testing.T) *httptest.Server {
	t.Helper()
	_, q := embeddedQueue(t)
	tokens, err := ingest.NewTokens(tokensFile(t,
		"tok-acme tenant=acme clients=acme-*",
		"tok-globex tenant=globex clients=globex-* delayed=2 backlogs=2 reads=1",
		"tok-all",
	), nil)
	if err != nil {
		t.Fatal(err)
	}
	// As a dispatcher does: a queued request has no stored event (ADR 18), the
	// dispatchers' lookup answers for it.
	stop, err := q.ServeQueuedLookups()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	api, err := ingest.New(ingest.Config{Tokens: tokens, Live: q, Status: q, Backlogs: q, PublishTimeout: 30 * time.Second}, q, q, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	return srv
}

type answer struct {
	Code              int
	RetryAfter        string `json:"-"` // the header
	PreferenceApplied string `json:"-"` // the header
	Problem           string `json:"code"`
	Detail            string
	ID                string
	ClientID          string
	Status            json.RawMessage
	Duplicate         bool
	NotBefore         time.Time
	Results           []struct {
		ID      string
		Status  string
		Problem *struct {
			Status int
			Code   string
		}
	}
}

func call(t *testing.T, ctx context.Context, method, url, token, body string, header ...string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{Detail: err.Error()}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := answer{Code: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After")}
	if ctx.Err() != nil {
		return a // the caller left: what came is not an answer to judge
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		t.Fatalf("%s %s answered %d with %q: %v", method, url, resp.StatusCode, raw, err)
	}
	a.Code, a.RetryAfter, a.PreferenceApplied = resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get(ingest.PreferenceAppliedHeader)
	return a
}

// A scoped token sends for its own clients only, and reads only their requests; its
// Idempotency-Keys are its own; a key sent again with another body is refused.
// (Finding 2 of issue 35: any token could send for, read and take over the keys of any
// client.)
func TestATokenSendsAndReadsOnlyForItsClients(t *testing.T) {
	t.Parallel()
	srv := scopedIngest(t)
	ctx := context.Background()
	post := func(token, client, key, body string) answer {
		h := []string{"X-Client-Id", client}
		if key != "" {
			h = append(h, "Idempotency-Key", key)
		}
		return call(t, ctx, http.MethodPost, srv.URL+"/v1/requests", token, body, h...)
	}

	// globex's token may not send for acme's client: 403, and nothing stored.
	if a := post("tok-globex", "acme-bob", "order-1236", `{"evil":true}`); a.Code != 403 || a.Problem != "client_not_allowed" || !strings.Contains(a.Detail, "acme-bob") {
		t.Fatalf("globex's token sending for acme-bob: %d %s %q, want 403 client_not_allowed naming the client", a.Code, a.Problem, a.Detail)
	}
	// So acme's own request with that key is the first, not a duplicate.
	mine := post("tok-acme", "acme-bob", "order-1236", `{"n":1}`)
	if mine.Code != 202 || mine.Duplicate {
		t.Fatalf("acme's request after globex's refused one: %d duplicate=%v, want 202, not a duplicate", mine.Code, mine.Duplicate)
	}
	// An unscoped token (all clients) may send for acme-bob, but the key is acme's own:
	// the same key from it names another request.
	other := post("tok-all", "acme-bob", "order-1236", `{"n":1}`)
	if other.Code != 202 || other.Duplicate || other.ID == mine.ID {
		t.Fatalf("the unscoped token with acme's key: %d duplicate=%v id=%s (acme's %s), want 202, a request of its own", other.Code, other.Duplicate, other.ID, mine.ID)
	}
	// The same key again from acme: with the same body a duplicate; with another, 409.
	if a := post("tok-acme", "acme-bob", "order-1236", `{"n":1}`); a.Code != 202 || !a.Duplicate || a.ID != mine.ID {
		t.Errorf("acme's retry with the same body: %d duplicate=%v, want 202 duplicate of %s", a.Code, a.Duplicate, mine.ID)
	}
	if a := post("tok-acme", "acme-bob", "order-1236", `{"n":2}`); a.Code != 409 || a.Problem != "idempotency_key_reused" || !strings.Contains(a.Detail, mine.ID) {
		t.Errorf("acme's key again with another body: %d %s %q, want 409 idempotency_key_reused naming %s", a.Code, a.Problem, a.Detail, mine.ID)
	}
	// In a batch, each item is judged alone.
	b := call(t, ctx, http.MethodPost, srv.URL+"/v1/requests/batch", "tok-globex",
		`[{"clientId":"globex-1","body":{}},{"clientId":"acme-bob","body":{}},{"clientId":"acme-bob","idempotencyKey":"order-1236","body":{"n":3}}]`)
	if b.Code != 200 || len(b.Results) != 3 || b.Results[0].Status != "queued" ||
		b.Results[1].Problem == nil || b.Results[1].Problem.Code != "client_not_allowed" || b.Results[1].Problem.Status != 403 ||
		b.Results[2].Problem == nil || b.Results[2].Problem.Code != "client_not_allowed" {
		t.Errorf("globex's batch with acme's client in it: %+v, want the first queued and the others 403 client_not_allowed", b)
	}
	ab := call(t, ctx, http.MethodPost, srv.URL+"/v1/requests/batch", "tok-acme",
		`[{"clientId":"acme-bob","idempotencyKey":"order-1236","body":{"n":3}}]`)
	if len(ab.Results) != 1 || ab.Results[0].Problem == nil || ab.Results[0].Problem.Code != "idempotency_key_reused" || ab.Results[0].Problem.Status != 409 {
		t.Errorf("acme's key in a batch with another body: %+v, want 409 idempotency_key_reused", ab)
	}

	// Reads: acme reads its request; globex reads it as unknown (its id says nothing).
	read := func(token, id string) string {
		a := call(t, ctx, http.MethodGet, srv.URL+"/v1/requests/"+id+"?clientId=acme-bob", token, "")
		var state string
		_ = json.Unmarshal(a.Status, &state)
		return fmt.Sprint(a.Code, " ", state, " ", a.ClientID)
	}
	if got := read("tok-acme", mine.ID); got != "200 queued acme-bob" {
		t.Errorf("acme reading its request: %q, want 200 queued acme-bob", got)
	}
	if got := read("tok-globex", mine.ID); got != "200 unknown " {
		t.Errorf("globex reading acme's request: %q, want 200 unknown (as for an id never given)", got)
	}
	if got := read("tok-all", mine.ID); got != "200 queued acme-bob" {
		t.Errorf("the unscoped token reading acme's request: %q, want 200 queued acme-bob", got)
	}
}

// A scoped token's shares: clients with a backlog, delayed requests, status reads at
// once; each past its share gets 429 with its own code, and the others' go on. (Finding 5
// of issue 35: one token could park twenty thousand clients for a week.)
func TestATokenHoldsOnlyItsShares(t *testing.T) {
	t.Parallel()
	srv := scopedIngest(t) // globex: backlogs=2 delayed=2 reads=1
	ctx := context.Background()
	post := func(token, client string, header ...string) answer {
		return call(t, ctx, http.MethodPost, srv.URL+"/v1/requests", token, `{}`, append([]string{"X-Client-Id", client}, header...)...)
	}
	for _, c := range []string{"globex-1", "globex-2"} {
		if a := post("tok-globex", c); a.Code != 202 {
			t.Fatalf("globex's request for %s: %d %s", c, a.Code, a.Detail)
		}
	}
	if a := post("tok-globex", "globex-3"); a.Code != 429 || a.Problem != "tenant_backlogs_full" || a.RetryAfter == "" {
		t.Errorf("globex's third client with a backlog: %d %s Retry-After %q, want 429 tenant_backlogs_full with a Retry-After", a.Code, a.Problem, a.RetryAfter)
	}
	if a := post("tok-globex", "globex-1"); a.Code != 202 {
		t.Errorf("globex's client that has a backlog already: %d %s, want 202", a.Code, a.Problem)
	}
	if a := post("tok-acme", "acme-3"); a.Code != 202 {
		t.Errorf("acme while globex is at its share: %d %s, want 202", a.Code, a.Problem)
	}

	for range 2 {
		if a := post("tok-globex", "globex-2", "Not-Before", "3600"); a.Code != 202 {
			t.Fatalf("globex's delayed request: %d %s", a.Code, a.Detail)
		}
	}
	if a := post("tok-globex", "globex-2", "Not-Before", "3600"); a.Code != 429 || a.Problem != "tenant_delayed_full" || a.RetryAfter == "" {
		t.Errorf("globex's third delayed request: %d %s Retry-After %q, want 429 tenant_delayed_full with a Retry-After", a.Code, a.Problem, a.RetryAfter)
	}
	if a := post("tok-globex", "globex-2"); a.Code != 202 {
		t.Errorf("globex's request without a delay: %d %s, want 202", a.Code, a.Problem)
	}

	// One waiting read held: globex's second is refused, acme's is not.
	id := request.NewID(time.Now())
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() { // a read that holds its slot; again if it was refused (one of the test's took it)
		for rctx.Err() == nil {
			call(t, rctx, http.MethodGet, srv.URL+"/v1/requests/"+id+"?clientId=globex-x&wait=60s", "tok-globex", "")
		}
	})
	// Until globex's first read holds its slot, a second one may still be let in: ask
	// until one is refused (the first holds its slot for a minute).
	deadline := time.Now().Add(30 * time.Second)
	for {
		a := call(t, ctx, http.MethodGet, srv.URL+"/v1/requests/"+id+"?clientId=globex-x&wait=1ms", "tok-globex", "")
		if a.Code == 429 && a.Problem == "tenant_reads_full" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("globex's second waiting read while one is held: %d %s, want 429 tenant_reads_full within 30 s", a.Code, a.Problem)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if a := call(t, ctx, http.MethodGet, srv.URL+"/v1/requests/"+id+"?clientId=acme-x&wait=1ms", "tok-acme", ""); a.Code != 200 {
		t.Errorf("acme's waiting read while globex holds its share: %d %s, want 200", a.Code, a.Problem)
	}
}

// Without a reads= share, each tenant or unscoped token holds at most an even share of
// the waiting reads: one token holding all of them no longer leaves none for another
// (issue 35, finding 3: with 1,000 held by one token, another's read got 503).
func TestOneTokenCannotHoldEveryWaitingRead(t *testing.T) {
	t.Parallel()
	_, q := embeddedQueue(t)
	tokens, err := ingest.NewTokens("", []string{"tok-a", "tok-b"})
	if err != nil {
		t.Fatal(err)
	}
	api, err := ingest.New(ingest.Config{Tokens: tokens, Status: q, MaxStatusWaits: 2}, q, q, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	url := srv.URL + "/v1/requests/" + request.NewID(time.Now()) + "?clientId=c"
	rctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() }) // after srv.Close, so it runs before it
	wg.Go(func() {                            // a read that holds its slot; again if it was refused (one of the test's took it)
		for rctx.Err() == nil {
			call(t, rctx, http.MethodGet, url+"&wait=60s", "tok-a", "")
		}
	})
	// Until a's first read holds its slot, a second may still be let in: ask until one is
	// refused (the first holds its slot for a minute).
	deadline := time.Now().Add(30 * time.Second)
	for {
		a := call(t, context.Background(), http.MethodGet, url+"&wait=1ms", "tok-a", "")
		if a.Code == 429 && a.Problem == "tenant_reads_full" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tok-a's second waiting read while its first is held: %d %s, want 429 tenant_reads_full (its share is 1 of 2)", a.Code, a.Problem)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if a := call(t, context.Background(), http.MethodGet, url+"&wait=1ms", "tok-b", ""); a.Code != 200 {
		t.Errorf("tok-b's waiting read while tok-a holds its share: %d %s, want 200", a.Code, a.Problem)
	}
}
