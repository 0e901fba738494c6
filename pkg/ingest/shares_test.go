package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/integration/itest"
	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// Tokens of two tenants, acme and globex, at least 32 characters as the settings ask.
const (
	acmeToken   = "acme-token-0123456789abcdef0123456789"
	globexToken = "globex-token-0123456789abcdef01234567"
)

// hammer sends calls (what gives the method and path of each) with token from n
// goroutines until ctx ends, and gives each answer's status and problem code to seen.
func hammer(ctx context.Context, wg *sync.WaitGroup, n int, token string, what func() (string, string), seen func(code int, problem string)) {
	for range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				method, url := what()
				req, _ := http.NewRequestWithContext(ctx, method, url, nil)
				req.Header.Set("Authorization", "Bearer "+token)
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					continue
				}
				var p struct{ Code string }
				_ = json.NewDecoder(res.Body).Decode(&p)
				res.Body.Close()
				seen(res.StatusCode, p.Code)
			}
		})
	}
}

// waitFor polls cond until it holds, failing the test past a deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 30 s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// One tenant holding all the cancels it can, or all the asks whether a request is queued
// it can, leaves another tenant its own: the other's cancels are decided, never 503
// overloaded, and its lookups reach the dispatchers. (Before, 16 cancels and 8 lookups
// were shared by all: one tenant's DELETEs for unknown ids made another's answer 503.)
func TestATenantCannotTakeAnothersCancelsOrLookups(t *testing.T) {
	t.Parallel()
	emb, q := bareQueue(t) // the test answers the dispatchers' asks
	tokens, err := ingest.NewTokens(tokensFile(t,
		acmeToken+" tenant=acme clients=acme-*",
		globexToken+" tenant=globex clients=globex-*",
	), nil)
	if err != nil {
		t.Fatal(err)
	}
	api, err := ingest.New(ingest.Config{Tokens: tokens, Status: q}, q, q, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)

	// The dispatchers' side, answering on NATS as they do: acme's asks are held until
	// the test ends (or their asker gives up), globex's answered at once. (Not the
	// queue's own ServeCancels: its bound of cancels at once is the dispatcher's, not
	// ingest's, and would be what acme fills.)
	release := make(chan struct{})
	nc, err := nats.Connect("", nats.InProcessServer(emb.Server()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var answering sync.WaitGroup
	t.Cleanup(answering.Wait)
	serve := func(subject string, held, heard *atomic.Int64, answer any) {
		t.Helper()
		sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
			var ask struct {
				ClientID string
				WithinMs int64
			}
			_ = json.Unmarshal(m.Data, &ask)
			if ask.ClientID != "acme-1" {
				heard.Add(1)
				b, _ := json.Marshal(answer)
				_ = m.Respond(b)
				return
			}
			held.Add(1)
			answering.Go(func() { // held apart: a subscription's messages come one at a time
				defer held.Add(-1)
				select {
				case <-release:
				case <-time.After(time.Duration(ask.WithinMs) * time.Millisecond):
				}
			})
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	var cancelsHeld, cancelsHeard, asksHeld, asksHeard atomic.Int64
	serve("dispatch.ctl.cancel", &cancelsHeld, &cancelsHeard, request.CancelAnswer{Outcome: request.CancelNotQueued})
	serve("dispatch.ctl.queued", &asksHeld, &asksHeard, map[string]bool{"found": false})
	// acme: 40 callers each of DELETEs and status reads of requests it never sent.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); close(release); wg.Wait() })
	var refused sync.Map // acme's refusals: "429 tenant_cancels_full"
	unknown := func(method string) func() (string, string) {
		return func() (string, string) {
			return method, srv.URL + "/v1/requests/" + request.NewID(time.Now()) + "?clientId=acme-1"
		}
	}
	hammer(ctx, &wg, 40, acmeToken, unknown(http.MethodDelete), func(code int, problem string) {
		if code == 429 || code == 503 {
			refused.Store(http.StatusText(code)+" "+problem, true)
		}
	})
	var refusedReads sync.Map // acme's status reads refused: "429 tenant_reads_full"
	hammer(ctx, &wg, 40, acmeToken, unknown(http.MethodGet), func(code int, problem string) {
		if code != http.StatusOK {
			refusedReads.Store(fmt.Sprint(code, " ", problem), true)
		}
	})

	// Its share of each is half (two tenants): 8 of 16 cancels, 4 of 8 asks.
	waitFor(t, "acme holding its share of cancels and asks, and being refused more", func() bool {
		n := 0
		refused.Range(func(any, any) bool { n++; return false })
		return cancelsHeld.Load() >= 8 && asksHeld.Load() >= 4 && n > 0
	})
	for i := range 5 {
		id := request.NewID(time.Now())
		del := call(t, context.Background(), http.MethodDelete, srv.URL+"/v1/requests/"+id+"?clientId=globex-1", globexToken, "")
		if del.Code != http.StatusNotFound {
			t.Errorf("globex's cancel %d while acme holds its share: %d %s %q, want 404 not_found (decided by the dispatchers)", i, del.Code, del.Problem, del.Detail)
		}
		heard := asksHeard.Load()
		if get := call(t, context.Background(), http.MethodGet, srv.URL+"/v1/requests/"+id+"?clientId=globex-1", globexToken, ""); get.Code != 200 {
			t.Errorf("globex's status read %d while acme holds its share: %d %s", i, get.Code, get.Problem)
		}
		if asksHeard.Load() != heard+1 {
			t.Errorf("globex's status read %d of an unknown request was not asked of the dispatchers: acme holds every ask", i)
		}
	}
	if cancelsHeard.Load() != 5 {
		t.Errorf("the dispatchers heard %d of globex's 5 cancels", cancelsHeard.Load())
	}
	// acme's refusals: 429 past its share; or 503 cancel_unavailable for one of its own
	// held cancels that the dispatchers did not answer in time (a busy machine), which is
	// what that cancel would get anyway. Never a full pool's 503 overloaded.
	sawShare := false
	refused.Range(func(k, _ any) bool {
		switch k {
		case "Too Many Requests tenant_cancels_full":
			sawShare = true
		case "Service Unavailable cancel_unavailable":
		default:
			t.Errorf("acme past its share of cancels: %s, want 429 tenant_cancels_full", k)
		}
		return true
	})
	if !sawShare {
		t.Error("acme was never refused past its share of cancels (429 tenant_cancels_full)")
	}
	// Its status reads past its share of lookups: 429 tenant_reads_full, or 503
	// status_unavailable for one of its own held lookups that timed out.
	sawShare = false
	refusedReads.Range(func(k, _ any) bool {
		switch k {
		case "429 tenant_reads_full":
			sawShare = true
		case "503 status_unavailable":
		default:
			t.Errorf("acme's status read past its share of lookups: %s, want 429 tenant_reads_full", k)
		}
		return true
	})
	if !sawShare {
		t.Error("acme's status reads were never refused past its share of lookups (429 tenant_reads_full)")
	}
}

// A token that is not scoped to a tenant still has shares of its own: with the
// defaults, it may not park more requests for later than DefaultUnscopedMaxDelayed on
// one ingest, and is told to write a tokens file. An ingest whose tokens are all
// unscoped says so once at its start, naming the file to write. (Before, 12 batches of
// one unscoped token parked 12,000 clients for 22 hours, none refused.)
func TestAnUnscopedTokenHasShares(t *testing.T) {
	t.Parallel()
	_, q := embeddedQueue(t)
	const token = "unscoped-token-0123456789abcdef012345"
	tokens, err := ingest.NewTokens("", []string{token})
	if err != nil {
		t.Fatal(err)
	}
	var logs itest.Buffer
	api, err := ingest.New(ingest.Config{Tokens: tokens, Backlogs: q, PublishTimeout: 30 * time.Second}, q, q, zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "INGEST_TOKENS_FILE"); n != 1 || !strings.Contains(logs.String(), `"level":"warn"`) {
		t.Errorf("an ingest with only an unscoped token logged %q: want one warning naming INGEST_TOKENS_FILE", logs.String())
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)

	ctx := context.Background()
	notBefore := time.Now().Add(22 * time.Hour).UTC().Format(time.RFC3339)
	batch := func(from, n int) answer {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, `{"clientId":"parked-%d","notBefore":%q,"body":{}}`+"\n", from+i, notBefore)
		}
		return call(t, ctx, http.MethodPost, srv.URL+"/v1/requests/batch", token, b.String(), "Content-Type", "application/x-ndjson")
	}
	sent := 0
	for sent < ingest.DefaultUnscopedMaxDelayed {
		n := min(ingest.DefaultBatchMaxItems, ingest.DefaultUnscopedMaxDelayed-sent)
		a := batch(sent, n)
		for i, r := range a.Results {
			if r.Status != "queued" {
				t.Fatalf("item %d of a batch within the unscoped share: %+v (answer %d %s), want queued", sent+i, r, a.Code, a.Problem)
			}
		}
		sent += n
	}
	a := batch(sent, 10)
	if len(a.Results) != 10 {
		t.Fatalf("a batch of 10 past the share: %d %s %q, want 10 results", a.Code, a.Problem, a.Detail)
	}
	for i, r := range a.Results {
		if r.Problem == nil || r.Problem.Status != 429 || r.Problem.Code != "tenant_delayed_full" {
			t.Errorf("item %d past the unscoped share of delayed requests: %+v, want 429 tenant_delayed_full", i, r)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/requests", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Client-Id", "parked-one-more")
	req.Header.Set("Not-Before", notBefore)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var p struct{ Code, Detail string }
	_ = json.NewDecoder(res.Body).Decode(&p)
	res.Body.Close()
	if res.StatusCode != 429 || res.Header.Get("Content-Type") != "application/problem+json" || p.Code != "tenant_delayed_full" ||
		res.Header.Get("Retry-After") == "" || !strings.Contains(p.Detail, "unscoped") || !strings.Contains(p.Detail, "INGEST_TOKENS_FILE") {
		t.Errorf("one more delayed request: %d %s %s %q (Retry-After %q), want 429 application/problem+json tenant_delayed_full with a Retry-After, saying the token is unscoped and naming INGEST_TOKENS_FILE",
			res.StatusCode, res.Header.Get("Content-Type"), p.Code, p.Detail, res.Header.Get("Retry-After"))
	}
	if a := call(t, ctx, http.MethodPost, srv.URL+"/v1/requests", token, `{}`, "X-Client-Id", "parked-1"); a.Code != 202 {
		t.Errorf("a request due now, for a client with a backlog: %d %s, want 202", a.Code, a.Problem)
	}

	// Tokens with a tenant among them: no warning.
	scoped, err := ingest.NewTokens(tokensFile(t, acmeToken+" tenant=acme clients=acme-*"), []string{token})
	if err != nil {
		t.Fatal(err)
	}
	var quiet itest.Buffer
	if _, err := ingest.New(ingest.Config{Tokens: scoped}, q, q, zerolog.New(&quiet)); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(quiet.String(), "INGEST_TOKENS_FILE") {
		t.Errorf("an ingest with a tenant's token logged %q, want no warning", quiet.String())
	}
}
