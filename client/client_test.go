package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/penguinhq/dispatcher/client"
)

// call is one request the fake ingest received.
type call struct {
	at     time.Time
	method string
	path   string // escaped, as sent
	query  string
	header http.Header
	body   []byte
}

// fakeIngest records every request it receives and lets the test answer it; n counts
// the calls from 1. newFakeIngest serves it on a real loopback server; newBubbleIngest
// calls it in the client's own goroutine, for tests in a testing/synctest bubble.
type fakeIngest struct {
	URL   string
	rt    http.RoundTripper // nil: the default transport reaches it
	opts  []client.Option   // what a client needs to reach it
	mu    sync.Mutex
	calls []call
}

type answerFunc func(n int, w http.ResponseWriter, r *http.Request, body []byte)

func (f *fakeIngest) handler(t testing.TB, answer answerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("fake ingest: reading the body: %v", err)
		}
		f.mu.Lock()
		f.calls = append(f.calls, call{at: time.Now(), method: r.Method, path: r.URL.EscapedPath(),
			query: r.URL.RawQuery, header: r.Header.Clone(), body: body})
		n := len(f.calls)
		f.mu.Unlock()
		answer(n, w, r, body)
	})
}

func newFakeIngest(t testing.TB, answer answerFunc) *fakeIngest {
	t.Helper()
	f := &fakeIngest{}
	srv := httptest.NewServer(f.handler(t, answer))
	t.Cleanup(srv.Close)
	f.URL = srv.URL
	return f
}

// newBubbleIngest is a fakeIngest without a network: its clients' requests are answered
// by calling the handler, so that a test in a synctest bubble sees time move only when
// the client or the handler waits. It cannot drop a connection (no Hijack).
func newBubbleIngest(t testing.TB, answer answerFunc) *fakeIngest {
	t.Helper()
	f := &fakeIngest{URL: "http://ingest.test"}
	f.rt = handlerTransport{f.handler(t, answer)}
	f.opts = []client.Option{client.WithHTTPClient(&http.Client{Transport: f.rt})}
	return f
}

// handlerTransport answers a request by serving it with h, as a server would: the
// handler sees the request's context end when the caller gives up, and the caller gets
// the context's error rather than an answer that came too late.
type handlerTransport struct{ h http.Handler }

func (ht handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	if r.Body == nil {
		r.Body = http.NoBody
	}
	r.RequestURI = req.URL.RequestURI()
	rec := httptest.NewRecorder()
	ht.h.ServeHTTP(rec, r)
	_ = r.Body.Close()
	if err := req.Context().Err(); err != nil {
		return nil, err
	}
	return rec.Result(), nil
}

func (f *fakeIngest) Calls() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeProblem answers as ingest does; retryAfter is the Retry-After header, "" for
// none.
func writeProblem(w http.ResponseWriter, status int, code, retryAfter string) {
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "about:blank", "title": http.StatusText(status),
		"status": status, "code": code, "detail": "detail of " + code})
}

// writeQueued answers a submit with 202, naming the request after its key.
func writeQueued(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusAccepted, map[string]any{"id": "id-" + r.Header.Get("Idempotency-Key"),
		"clientId": r.Header.Get("X-Client-Id"), "status": "queued"})
}

// dropConnection closes the connection without an answer.
func dropConnection(t testing.TB, w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Errorf("hijacking: %v", err)
		return
	}
	_ = conn.Close()
}

// fastRetry keeps the random part of retry waits to milliseconds.
var fastRetry = client.WithRetry(client.RetryPolicy{Base: time.Millisecond, Max: 5 * time.Millisecond})

func newTestClient(t testing.TB, ingest *fakeIngest, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(ingest.URL, append(append([]client.Option{fastRetry}, ingest.opts...), opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

func testContext(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestNew(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		baseURL string
		opts    []client.Option
		ok      bool
	}{
		"OK":                    {baseURL: "http://localhost:8080", ok: true},
		"OKWithPathAndSlash":    {baseURL: "https://ingest.example/prefix/", ok: true},
		"ErrEmpty":              {baseURL: ""},
		"ErrRelative":           {baseURL: "/v1"},
		"ErrNoScheme":           {baseURL: "ingest.example:8080"},
		"ErrScheme":             {baseURL: "ftp://ingest.example"},
		"ErrNoHost":             {baseURL: "http:///v1"},
		"ErrQuery":              {baseURL: "http://ingest.example/?a=b"},
		"ErrNilHTTPClient":      {baseURL: "http://ingest.example", opts: []client.Option{client.WithHTTPClient(nil)}},
		"ErrEmptyToken":         {baseURL: "http://ingest.example", opts: []client.Option{client.WithToken("")}},
		"ErrRetryMaxBelowBase":  {baseURL: "http://ingest.example", opts: []client.Option{client.WithRetry(client.RetryPolicy{Base: time.Second, Max: time.Millisecond})}},
		"ErrRetryNegativeTries": {baseURL: "http://ingest.example", opts: []client.Option{client.WithRetry(client.RetryPolicy{MaxAttempts: -1})}},
		"ErrMaxBatchItems":      {baseURL: "http://ingest.example", opts: []client.Option{client.WithMaxBatchItems(0)}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c, err := client.New(tc.baseURL, tc.opts...)
			if tc.ok && (err != nil || c == nil) {
				t.Fatalf("New(%q) = %v, %v; want a client", tc.baseURL, c, err)
			}
			if !tc.ok && err == nil {
				t.Fatalf("New(%q) made a client; want an error", tc.baseURL)
			}
		})
	}
}

func TestSubmitSendsRequest(t *testing.T) {
	t.Parallel()
	ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
		writeJSON(w, http.StatusAccepted, map[string]any{"id": "req-1", "clientId": r.Header.Get("X-Client-Id"),
			"status": "queued", "notBefore": "2030-01-02T03:04:05Z"})
	})
	c := newTestClient(t, &fakeIngest{URL: ingest.URL + "/"}, client.WithToken("tok")) // a base URL with a trailing slash
	body := []byte(" { \"fish\" : [1, 2],\n \"name\": \"pingu\u00e9\" } ")

	receipt, err := c.Submit(testContext(t, 10*time.Second), "penguin-7", body)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	calls := ingest.Calls()
	if len(calls) != 1 {
		t.Fatalf("ingest got %d calls; want 1", len(calls))
	}
	got := calls[0]
	if got.method != http.MethodPost || got.path != "/v1/requests" {
		t.Errorf("request = %s %s; want POST /v1/requests", got.method, got.path)
	}
	if string(got.body) != string(body) {
		t.Errorf("body = %q; want %q byte for byte", got.body, body)
	}
	for name, want := range map[string]string{
		"Content-Type":  "application/json",
		"X-Client-Id":   "penguin-7",
		"Authorization": "Bearer tok",
		"Not-Before":    "",
	} {
		if v := got.header.Get(name); v != want {
			t.Errorf("header %s = %q; want %q", name, v, want)
		}
	}
	key := got.header.Get("Idempotency-Key")
	if len(key) < 26 {
		t.Errorf("generated Idempotency-Key %q is shorter than 128 bits of base32", key)
	}
	want := client.Receipt{ID: "req-1", ClientID: "penguin-7", IdempotencyKey: key,
		NotBefore: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
	if !receipt.NotBefore.Equal(want.NotBefore) || receipt.ID != want.ID || receipt.ClientID != want.ClientID ||
		receipt.IdempotencyKey != want.IdempotencyKey || receipt.Duplicate {
		t.Errorf("receipt = %+v; want %+v", receipt, want)
	}
}

// Not-Before and Not-After are sent as the options say: in UTC with nanoseconds, a delay
// rounded up to whole seconds, the last option winning, none taken back by a zero time.
func TestSubmitNotBeforeAndNotAfter(t *testing.T) {
	t.Parallel()
	zone := time.FixedZone("UTC+2", 2*60*60)
	for name, tc := range map[string]struct {
		opts   []client.SubmitOption
		header string
		want   string
	}{
		"NotBeforeInUTCWithNanoseconds": {opts: []client.SubmitOption{client.WithNotBefore(time.Date(2030, 1, 2, 5, 4, 5, 123456789, zone))}, header: "Not-Before", want: "2030-01-02T03:04:05.123456789Z"},
		"DelayRoundedUp":                {opts: []client.SubmitOption{client.WithDelay(1500 * time.Millisecond)}, header: "Not-Before", want: "2"},
		"DelayWholeSeconds":             {opts: []client.SubmitOption{client.WithDelay(2 * time.Second)}, header: "Not-Before", want: "2"},
		"NoDelay":                       {opts: []client.SubmitOption{client.WithDelay(0)}, header: "Not-Before", want: ""},
		"LastWins":                      {opts: []client.SubmitOption{client.WithNotBefore(time.Now()), client.WithDelay(time.Minute)}, header: "Not-Before", want: "60"},
		"NotAfterInUTCWithNanoseconds":  {opts: []client.SubmitOption{client.WithNotAfter(time.Date(2030, 1, 2, 5, 4, 5, 123456789, zone))}, header: "Not-After", want: "2030-01-02T03:04:05.123456789Z"},
		"NoNotAfter":                    {header: "Not-After", want: ""},
		"NotAfterTakenBack":             {opts: []client.SubmitOption{client.WithNotAfter(time.Now()), client.WithNotAfter(time.Time{})}, header: "Not-After", want: ""},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) { writeQueued(w, r) })
			c := newTestClient(t, ingest)
			if _, err := c.Submit(testContext(t, 10*time.Second), "penguin-7", []byte(`{}`), tc.opts...); err != nil {
				t.Fatalf("Submit: %v", err)
			}
			if got := ingest.Calls()[0].header.Get(tc.header); got != tc.want {
				t.Errorf("%s = %q; want %q", tc.header, got, tc.want)
			}
		})
	}
}

// In a synctest bubble: the wait of a second takes none, and the gap is exact.
func TestSubmitRetriesOn429HonouringRetryAfter(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ingest := newBubbleIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
			if n == 1 {
				writeProblem(w, http.StatusTooManyRequests, "backlog_full", "1")
				return
			}
			writeQueued(w, r)
		})
		c := newTestClient(t, ingest)

		receipt, err := c.Submit(testContext(t, 10*time.Second), "penguin-7", []byte(`{"fish":3}`))
		if err != nil {
			t.Fatalf("Submit: %v", err)
		}
		calls := ingest.Calls()
		if len(calls) != 2 {
			t.Fatalf("ingest got %d calls; want 2", len(calls))
		}
		if gap := calls[1].at.Sub(calls[0].at); gap < time.Second {
			t.Errorf("retried %v after a 429 with Retry-After: 1; want at least 1s", gap)
		}
		if k0, k1 := calls[0].header.Get("Idempotency-Key"), calls[1].header.Get("Idempotency-Key"); k0 != k1 || k0 != receipt.IdempotencyKey {
			t.Errorf("Idempotency-Keys = %q, %q, receipt %q; want one key", k0, k1, receipt.IdempotencyKey)
		}
	})
}

func TestSubmitRetriesOn503AndProxyErrors(t *testing.T) {
	t.Parallel()
	ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
		switch n {
		case 1:
			writeProblem(w, http.StatusServiceUnavailable, "queue_unavailable", "0")
		case 2:
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusBadGateway)
			_, _ = io.WriteString(w, "upstream connect error")
		case 3:
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusGatewayTimeout)
			_, _ = io.WriteString(w, "<html>gateway timeout</html>")
		default:
			writeQueued(w, r)
		}
	})
	c := newTestClient(t, ingest)

	receipt, err := c.Submit(testContext(t, 10*time.Second), "penguin-7", []byte(`{"fish":3}`))
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	calls := ingest.Calls()
	if len(calls) != 4 {
		t.Fatalf("ingest got %d calls; want 4", len(calls))
	}
	for i, call := range calls {
		if key := call.header.Get("Idempotency-Key"); key != receipt.IdempotencyKey {
			t.Errorf("call %d had Idempotency-Key %q; want %q on every retry", i+1, key, receipt.IdempotencyKey)
		}
		if string(call.body) != `{"fish":3}` {
			t.Errorf("call %d had body %q", i+1, call.body)
		}
	}
}

func TestSubmitRetriesWhenConnectionDropped(t *testing.T) {
	t.Parallel()
	ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
		if n <= 2 {
			dropConnection(t, w)
			return
		}
		writeQueued(w, r)
	})
	c := newTestClient(t, ingest)

	receipt, err := c.Submit(testContext(t, 10*time.Second), "penguin-7", []byte(`{"fish":3}`))
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	calls := ingest.Calls()
	if len(calls) != 3 {
		t.Fatalf("ingest got %d calls; want 3 (two dropped, one answered)", len(calls))
	}
	for i, call := range calls {
		if key := call.header.Get("Idempotency-Key"); key != receipt.IdempotencyKey {
			t.Errorf("call %d had Idempotency-Key %q; want %q", i+1, key, receipt.IdempotencyKey)
		}
	}
	if receipt.ID != "id-"+receipt.IdempotencyKey {
		t.Errorf("receipt ID = %q", receipt.ID)
	}
}

func TestSubmitIdempotencyKeys(t *testing.T) {
	t.Parallel()
	ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) { writeQueued(w, r) })
	c := newTestClient(t, ingest)
	ctx := testContext(t, 10*time.Second)

	first, err1 := c.Submit(ctx, "penguin-7", []byte(`1`))
	second, err2 := c.Submit(ctx, "penguin-7", []byte(`1`))
	own, err3 := c.Submit(ctx, "penguin-7", []byte(`1`), client.WithIdempotencyKey("order-1234"))
	if err := errors.Join(err1, err2, err3); err != nil {
		t.Fatalf("Submit: %v", err)
	}
	calls := ingest.Calls()
	keys := []string{calls[0].header.Get("Idempotency-Key"), calls[1].header.Get("Idempotency-Key"), calls[2].header.Get("Idempotency-Key")}
	if keys[0] == keys[1] {
		t.Errorf("two Submits sent the same generated key %q", keys[0])
	}
	if keys[0] != first.IdempotencyKey || keys[1] != second.IdempotencyKey {
		t.Errorf("receipts say keys %q, %q; ingest got %q, %q", first.IdempotencyKey, second.IdempotencyKey, keys[0], keys[1])
	}
	if keys[2] != "order-1234" || own.IdempotencyKey != "order-1234" {
		t.Errorf("caller's key: sent %q, receipt %q; want order-1234", keys[2], own.IdempotencyKey)
	}
}

func TestSubmitDuplicate(t *testing.T) {
	t.Parallel()
	ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
		writeJSON(w, http.StatusAccepted, map[string]any{"id": "req-1", "clientId": "penguin-7", "status": "queued", "duplicate": true})
	})
	c := newTestClient(t, ingest)
	receipt, err := c.Submit(testContext(t, 10*time.Second), "penguin-7", []byte(`1`), client.WithIdempotencyKey("k"))
	if err != nil || !receipt.Duplicate || receipt.ID != "req-1" {
		t.Errorf("Submit = %+v, %v; want a duplicate receipt for req-1", receipt, err)
	}
}

func TestSubmitDoesNotRetry(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		status int
		code   string // "" answers text/plain
	}{
		"BadRequest":           {status: http.StatusBadRequest, code: "malformed_json"},
		"Unauthorized":         {status: http.StatusUnauthorized, code: "unauthorized"},
		"RequestTimeout":       {status: http.StatusRequestTimeout, code: "body_timeout"},
		"ContentTooLarge":      {status: http.StatusRequestEntityTooLarge, code: "body_too_large"},
		"UnsupportedMediaType": {status: http.StatusUnsupportedMediaType, code: "unsupported_media_type"},
		"InternalServerError":  {status: http.StatusInternalServerError},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
				if tc.code == "" {
					w.Header().Set("Content-Type", "text/plain; charset=utf-8")
					w.WriteHeader(tc.status)
					_, _ = io.WriteString(w, "  something\n broke  ")
					return
				}
				writeProblem(w, tc.status, tc.code, "")
			})
			c := newTestClient(t, ingest)

			_, err := c.Submit(testContext(t, 10*time.Second), "penguin-7", []byte(`{}`))
			var p *client.Problem
			if !errors.As(err, &p) {
				t.Fatalf("Submit error = %v; want a *Problem", err)
			}
			if p.Status != tc.status || p.Code != tc.code {
				t.Errorf("problem = %+v; want status %d code %q", p, tc.status, tc.code)
			}
			if tc.code == "" && p.Detail != "something broke" {
				t.Errorf("detail = %q; want the body's first bytes, %q", p.Detail, "something broke")
			}
			if n := len(ingest.Calls()); n != 1 {
				t.Errorf("ingest got %d calls; want exactly 1", n)
			}
		})
	}
}

// In a synctest bubble: the context ends after 200 ms of the bubble's clock, which moves
// only while the client waits between tries, however long a try takes.
func TestSubmitContextEndsRetries(t *testing.T) {
	t.Parallel()
	for name, retryAfter := range map[string]string{
		"DuringRetryAfter": "1", // the wait outlasts the context
		"AfterManyTries":   "",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				ingest := newBubbleIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
					writeProblem(w, http.StatusServiceUnavailable, "queue_unavailable", retryAfter)
				})
				c := newTestClient(t, ingest)

				_, err := c.Submit(testContext(t, 200*time.Millisecond), "penguin-7", []byte(`{}`))
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("errors.Is(%v, context.DeadlineExceeded) = false", err)
				}
				var p *client.Problem
				if !errors.As(err, &p) || p.Code != "queue_unavailable" {
					t.Errorf("errors.As(%v, *Problem) found %+v; want the last problem, queue_unavailable", err, p)
				}
				if calls := ingest.Calls(); retryAfter == "" && len(calls) < 2 {
					t.Errorf("ingest got %d calls in 200ms of retries a few milliseconds apart; want many", len(calls))
				}
			})
		})
	}
}

func TestSubmitMaxAttempts(t *testing.T) {
	t.Parallel()
	ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
		writeProblem(w, http.StatusServiceUnavailable, "overloaded", "")
	})
	c := newTestClient(t, ingest, client.WithRetry(client.RetryPolicy{Base: time.Millisecond, Max: time.Millisecond, MaxAttempts: 3}))

	_, err := c.Submit(testContext(t, 10*time.Second), "penguin-7", []byte(`{}`))
	var p *client.Problem
	if !errors.As(err, &p) || p.Code != "overloaded" {
		t.Errorf("error = %v; want one wrapping the overloaded problem", err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error = %v; want no context error, the context did not end", err)
	}
	if n := len(ingest.Calls()); n != 3 {
		t.Errorf("ingest got %d calls; want MaxAttempts, 3", n)
	}
}

func TestSubmitChecksArgumentsLocally(t *testing.T) {
	t.Parallel()
	ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) { writeQueued(w, r) })
	c := newTestClient(t, ingest)
	ctx := testContext(t, 10*time.Second)

	if _, err := c.Submit(ctx, "", []byte(`{}`)); !errors.Is(err, client.ErrClientIDMissing) {
		t.Errorf("Submit with no clientId = %v; want ErrClientIDMissing", err)
	}
	if _, err := c.Submit(ctx, "penguin-7", []byte(`{"fish":`)); !errors.Is(err, client.ErrBodyNotJSON) {
		t.Errorf("Submit with a broken body = %v; want ErrBodyNotJSON", err)
	}
	if _, err := c.Status(ctx, "penguin-7", ""); !errors.Is(err, client.ErrIDMissing) {
		t.Errorf("Status with no id = %v; want ErrIDMissing", err)
	}
	if _, err := c.Status(ctx, "", "req-1"); !errors.Is(err, client.ErrClientIDMissing) {
		t.Errorf("Status with no clientId = %v; want ErrClientIDMissing", err)
	}
	if n := len(ingest.Calls()); n != 0 {
		t.Errorf("ingest got %d calls; want none", n)
	}
}

// batchItem is an item as the fake ingest reads it.
type batchItem struct {
	ClientID       string          `json:"clientId"`
	Body           json.RawMessage `json:"body"`
	IdempotencyKey string          `json:"idempotencyKey"`
	NotBefore      string          `json:"notBefore"`
	NotAfter       string          `json:"notAfter"`
}

func decodeBatch(t testing.TB, body []byte) []batchItem {
	t.Helper()
	var items []batchItem
	if err := json.Unmarshal(body, &items); err != nil {
		t.Errorf("the batch is not a JSON array of items: %v: %s", err, body)
	}
	return items
}

func queuedResult(i int, item batchItem) map[string]any {
	return map[string]any{"index": i, "status": "queued", "id": "id-" + item.IdempotencyKey, "clientId": item.ClientID}
}

func failedResult(i, status int, code string, retryAfter int) map[string]any {
	problem := map[string]any{"status": status, "code": code, "detail": "detail of " + code}
	if retryAfter > 0 {
		problem["retryAfter"] = retryAfter
	}
	return map[string]any{"index": i, "status": "failed", "problem": problem}
}

func writeBatchAnswer(w http.ResponseWriter, results []map[string]any) {
	writeJSON(w, http.StatusOK, map[string]any{"results": results})
}

func TestSubmitBatchResendsOnlyRetryableItems(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ingest := newBubbleIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
			items := decodeBatch(t, body)
			results := make([]map[string]any, len(items))
			for i, item := range items {
				switch {
				case n > 1:
					results[i] = queuedResult(i, item)
				case item.ClientID == "penguin-1":
					results[i] = failedResult(i, http.StatusTooManyRequests, "backlog_full", 1)
				case item.ClientID == "penguin-2":
					results[i] = failedResult(i, http.StatusBadRequest, "idempotency_key_invalid", 0)
				case item.ClientID == "penguin-3":
					results[i] = failedResult(i, http.StatusServiceUnavailable, "queue_full", 0)
				case item.ClientID == "penguin-4":
					results[i] = queuedResult(i, item)
					results[i]["duplicate"] = true
				default:
					results[i] = queuedResult(i, item)
				}
			}
			writeBatchAnswer(w, results)
		})
		c := newTestClient(t, ingest)
		items := make([]client.Item, 5)
		for i := range items {
			items[i] = client.Item{ClientID: fmt.Sprintf("penguin-%d", i), Body: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
		}
		items[4].IdempotencyKey = "order-4"

		results, err := c.SubmitBatch(testContext(t, 10*time.Second), items)
		if err != nil {
			t.Fatalf("SubmitBatch: %v", err)
		}
		calls := ingest.Calls()
		if len(calls) != 2 {
			t.Fatalf("ingest got %d calls; want 2", len(calls))
		}
		if gap := calls[1].at.Sub(calls[0].at); gap < time.Second {
			t.Errorf("resent %v after retryAfter 1; want at least 1s", gap)
		}
		first, second := decodeBatch(t, calls[0].body), decodeBatch(t, calls[1].body)
		if len(first) != 5 {
			t.Fatalf("first batch had %d items; want 5", len(first))
		}
		if len(second) != 2 || second[0].IdempotencyKey != first[1].IdempotencyKey || second[1].IdempotencyKey != first[3].IdempotencyKey ||
			string(second[0].Body) != `{"n":1}` || string(second[1].Body) != `{"n":3}` {
			t.Errorf("second batch = %+v; want items 1 and 3 only, with their first keys %q and %q", second, first[1].IdempotencyKey, first[3].IdempotencyKey)
		}
		if first[4].IdempotencyKey != "order-4" {
			t.Errorf("item 4 was sent with key %q; want the caller's, order-4", first[4].IdempotencyKey)
		}
		if len(results) != len(items) {
			t.Fatalf("got %d results for %d items", len(results), len(items))
		}
		for i, r := range results {
			if r.Receipt.ClientID != items[i].ClientID || r.Receipt.IdempotencyKey != first[i].IdempotencyKey {
				t.Errorf("result %d = %+v; want it for %s with key %q", i, r, items[i].ClientID, first[i].IdempotencyKey)
			}
			if i == 2 {
				var p *client.Problem
				if !errors.As(r.Err, &p) || p.Status != http.StatusBadRequest || p.Code != "idempotency_key_invalid" {
					t.Errorf("result 2 error = %v; want the 400 idempotency_key_invalid problem", r.Err)
				}
				continue
			}
			if r.Err != nil || r.Receipt.ID != "id-"+first[i].IdempotencyKey {
				t.Errorf("result %d = %+v; want stored as id-%s", i, r, first[i].IdempotencyKey)
			}
		}
		if !results[4].Receipt.Duplicate {
			t.Errorf("result 4 is not marked duplicate")
		}
	})
}

func TestSubmitBatchSplitsLargeBatches(t *testing.T) {
	t.Parallel()
	ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
		items := decodeBatch(t, body)
		results := make([]map[string]any, len(items))
		for i, item := range items {
			results[i] = queuedResult(i, item)
		}
		writeBatchAnswer(w, results)
	})
	c := newTestClient(t, ingest, client.WithMaxBatchItems(2))
	items := make([]client.Item, 5)
	for i := range items {
		items[i] = client.Item{ClientID: fmt.Sprintf("penguin-%d", i), Body: json.RawMessage(`{}`)}
	}

	results, err := c.SubmitBatch(testContext(t, 10*time.Second), items)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	var sizes []int
	keys := map[string]bool{}
	for _, call := range ingest.Calls() {
		batch := decodeBatch(t, call.body)
		sizes = append(sizes, len(batch))
		for _, item := range batch {
			keys[item.IdempotencyKey] = true
		}
	}
	if !slices.Equal(sizes, []int{2, 2, 1}) {
		t.Errorf("batch sizes = %v; want [2 2 1]", sizes)
	}
	if len(keys) != 5 {
		t.Errorf("got %d distinct generated keys for 5 items", len(keys))
	}
	for i, r := range results {
		if r.Err != nil || r.Receipt.ClientID != items[i].ClientID || r.Receipt.ID != "id-"+r.Receipt.IdempotencyKey {
			t.Errorf("result %d = %+v; want %s stored", i, r, items[i].ClientID)
		}
	}
}

func TestSubmitBatchRetriesWholeBatch(t *testing.T) {
	t.Parallel()
	ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
		switch n {
		case 1:
			writeProblem(w, http.StatusServiceUnavailable, "overloaded", "0")
		case 2:
			dropConnection(t, w)
		default:
			items := decodeBatch(t, body)
			results := make([]map[string]any, len(items))
			for i, item := range items {
				results[i] = queuedResult(i, item)
			}
			writeBatchAnswer(w, results)
		}
	})
	c := newTestClient(t, ingest)
	notBefore := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	items := []client.Item{
		{ClientID: "penguin-0", Body: json.RawMessage(`{}`), NotBefore: notBefore},
		{ClientID: "penguin-1", Body: json.RawMessage(`[]`)},
	}

	results, err := c.SubmitBatch(testContext(t, 10*time.Second), items)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	calls := ingest.Calls()
	if len(calls) != 3 {
		t.Fatalf("ingest got %d calls; want 3", len(calls))
	}
	for n, call := range calls {
		if ct := call.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("call %d Content-Type = %q", n+1, ct)
		}
		batch := decodeBatch(t, call.body)
		if len(batch) != 2 || batch[0].IdempotencyKey != results[0].Receipt.IdempotencyKey || batch[1].IdempotencyKey != results[1].Receipt.IdempotencyKey {
			t.Errorf("call %d = %+v; want both items with the same keys each time", n+1, batch)
		}
		if batch[0].NotBefore != "2030-01-02T03:04:05Z" || batch[1].NotBefore != "" {
			t.Errorf("call %d notBefore = %q, %q", n+1, batch[0].NotBefore, batch[1].NotBefore)
		}
	}
	for i, r := range results {
		if r.Err != nil || r.Receipt.ID == "" {
			t.Errorf("result %d = %+v; want stored", i, r)
		}
	}
}

func TestSubmitBatchWholeBatchRefused(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		status int
		code   string
	}{
		"BatchTooLarge": {status: http.StatusRequestEntityTooLarge, code: "batch_too_large"},
		"Unauthorized":  {status: http.StatusUnauthorized, code: "unauthorized"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
				writeProblem(w, tc.status, tc.code, "")
			})
			c := newTestClient(t, ingest)
			items := []client.Item{{ClientID: "penguin-0", Body: json.RawMessage(`{}`)}, {ClientID: "penguin-1", Body: json.RawMessage(`{}`)}}

			results, err := c.SubmitBatch(testContext(t, 10*time.Second), items)
			var p *client.Problem
			if !errors.As(err, &p) || p.Status != tc.status || p.Code != tc.code {
				t.Fatalf("SubmitBatch error = %v; want the %d %s problem", err, tc.status, tc.code)
			}
			if n := len(ingest.Calls()); n != 1 {
				t.Errorf("ingest got %d calls; want exactly 1", n)
			}
			for i, r := range results {
				if !errors.Is(r.Err, err) {
					t.Errorf("result %d error = %v; want the batch's error", i, r.Err)
				}
			}
		})
	}
}

func TestSubmitBatchRefusedAfterItemFates(t *testing.T) {
	t.Parallel()
	ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
		if n > 1 {
			writeProblem(w, http.StatusUnauthorized, "unauthorized", "")
			return
		}
		items := decodeBatch(t, body)
		writeBatchAnswer(w, []map[string]any{
			queuedResult(0, items[0]),
			failedResult(1, http.StatusBadRequest, "not_before_invalid", 0),
			failedResult(2, http.StatusTooManyRequests, "backlog_full", 0),
		})
	})
	c := newTestClient(t, ingest)
	items := make([]client.Item, 4)
	for i := range items {
		items[i] = client.Item{ClientID: fmt.Sprintf("penguin-%d", i), Body: json.RawMessage(`{}`)}
	}
	items[3].ClientID = ""

	results, err := c.SubmitBatch(testContext(t, 10*time.Second), items)
	var p *client.Problem
	if !errors.As(err, &p) || p.Code != "unauthorized" {
		t.Fatalf("SubmitBatch error = %v; want the 401 of the resend", err)
	}
	if results[0].Err != nil || results[0].Receipt.ID == "" {
		t.Errorf("result 0 = %+v; want stored by the first call", results[0])
	}
	if !errors.As(results[1].Err, &p) || p.Code != "not_before_invalid" {
		t.Errorf("result 1 error = %v; want its own 400, not the later 401", results[1].Err)
	}
	if !errors.Is(results[2].Err, err) {
		t.Errorf("result 2 error = %v; want the 401 that refused its resend", results[2].Err)
	}
	if !errors.Is(results[3].Err, client.ErrClientIDMissing) {
		t.Errorf("result 3 error = %v; want ErrClientIDMissing", results[3].Err)
	}
}

func TestSubmitBatchContextEnds(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ingest := newBubbleIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
			items := decodeBatch(t, body)
			results := make([]map[string]any, len(items))
			for i, item := range items {
				results[i] = queuedResult(i, item)
				if item.ClientID == "penguin-1" {
					results[i] = failedResult(i, http.StatusTooManyRequests, "backlog_full", 0)
				}
			}
			writeBatchAnswer(w, results)
		})
		c := newTestClient(t, ingest)
		items := []client.Item{{ClientID: "penguin-0", Body: json.RawMessage(`{}`)}, {ClientID: "penguin-1", Body: json.RawMessage(`{}`)}}

		results, err := c.SubmitBatch(testContext(t, 200*time.Millisecond), items)
		if err != nil {
			t.Fatalf("SubmitBatch error = %v; want the context's end reported per item", err)
		}
		if results[0].Err != nil || results[0].Receipt.ID == "" {
			t.Errorf("result 0 = %+v; want stored", results[0])
		}
		var p *client.Problem
		if !errors.Is(results[1].Err, context.DeadlineExceeded) || !errors.As(results[1].Err, &p) || p.Code != "backlog_full" {
			t.Errorf("result 1 error = %v; want one wrapping context.DeadlineExceeded and the backlog_full problem", results[1].Err)
		}
		calls := ingest.Calls()
		if len(calls) < 2 {
			t.Fatalf("ingest got %d calls; want the 429 item resent", len(calls))
		}
		for n, call := range calls[1:] {
			if batch := decodeBatch(t, call.body); len(batch) != 1 || batch[0].ClientID != "penguin-1" {
				t.Errorf("call %d = %+v; want only the 429 item", n+2, batch)
			}
		}
	})
}

func TestSubmitBatchChecksItemsLocally(t *testing.T) {
	t.Parallel()
	ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
		items := decodeBatch(t, body)
		results := make([]map[string]any, len(items))
		for i, item := range items {
			results[i] = queuedResult(i, item)
		}
		writeBatchAnswer(w, results)
	})
	c := newTestClient(t, ingest)
	items := []client.Item{
		{ClientID: "penguin-0", Body: json.RawMessage(`{}`)},
		{ClientID: "penguin-1", Body: json.RawMessage(`{"fish":`)},
		{ClientID: "", Body: json.RawMessage(`{}`)},
		{ClientID: "penguin-3", Body: json.RawMessage(" { \"html\": \"<b>&</b>\",\n \"n\" : 1 } ")},
	}

	results, err := c.SubmitBatch(testContext(t, 10*time.Second), items)
	if err != nil {
		t.Fatalf("SubmitBatch: %v", err)
	}
	if !errors.Is(results[1].Err, client.ErrBodyNotJSON) || !errors.Is(results[2].Err, client.ErrClientIDMissing) {
		t.Errorf("results 1 and 2 errors = %v, %v; want ErrBodyNotJSON and ErrClientIDMissing", results[1].Err, results[2].Err)
	}
	if results[0].Err != nil || results[3].Err != nil || results[3].Receipt.ClientID != "penguin-3" {
		t.Errorf("results 0 and 3 = %+v, %+v; want stored", results[0], results[3])
	}
	raw := ingest.Calls()[0].body
	sent := decodeBatch(t, raw)
	if len(sent) != 2 || sent[0].ClientID != "penguin-0" || sent[1].ClientID != "penguin-3" {
		t.Errorf("sent %+v; want items 0 and 3 only", sent)
	}
	if !bytes.Contains(raw, items[3].Body) {
		t.Errorf("batch %s does not hold item 3's body %q byte for byte", raw, items[3].Body)
	}
}

func TestStatus(t *testing.T) {
	t.Parallel()
	ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"a/b c","clientId":"penguin-7","status":"dead_lettered",
			"acceptedAt":"2030-01-02T03:04:05Z","notBefore":"2030-01-02T03:04:06Z","attempts":3,
			"lastAttempt":{"at":"2030-01-02T03:04:07Z","status":400,"error":"bad fish"},
			"deadLetter":{"reason":"permanent","at":"2030-01-02T03:04:08Z","lastStatus":400,"lastError":"bad fish","replayable":true},
			"replays":1,"queue":{"backlog":12,"atHead":true},"updatedAt":"2030-01-02T03:04:09Z","futureField":1}`)
	})
	c := newTestClient(t, ingest, client.WithToken("tok"))

	s, err := c.Status(testContext(t, 10*time.Second), "penguin 7", "a/b c")
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	got := ingest.Calls()[0]
	if got.method != http.MethodGet || got.path != "/v1/requests/a%2Fb%20c" || got.query != "clientId=penguin+7" {
		t.Errorf("request = %s %s?%s; want GET /v1/requests/a%%2Fb%%20c?clientId=penguin+7, with no wait", got.method, got.path, got.query)
	}
	if a := got.header.Get("Authorization"); a != "Bearer tok" {
		t.Errorf("Authorization = %q", a)
	}
	at := func(sec int) time.Time { return time.Date(2030, 1, 2, 3, 4, sec, 0, time.UTC) }
	if s.ID != "a/b c" || s.ClientID != "penguin-7" || s.State != client.StatusDeadLettered || !s.Final() ||
		!s.AcceptedAt.Equal(at(5)) || !s.NotBefore.Equal(at(6)) || s.Attempts != 3 || s.Replays != 1 || !s.UpdatedAt.Equal(at(9)) {
		t.Errorf("status = %+v", s)
	}
	if s.LastAttempt == nil || !s.LastAttempt.At.Equal(at(7)) || s.LastAttempt.Status != 400 || s.LastAttempt.Error != "bad fish" {
		t.Errorf("last attempt = %+v", s.LastAttempt)
	}
	if d := s.DeadLetter; d == nil || d.Reason != "permanent" || !d.At.Equal(at(8)) || d.LastStatus != 400 || d.LastError != "bad fish" || !d.Replayable {
		t.Errorf("dead letter = %+v", d)
	}
	if s.Queue == nil || s.Queue.Backlog != 12 || !s.Queue.AtHead {
		t.Errorf("queue = %+v", s.Queue)
	}
}

func TestStatusFinal(t *testing.T) {
	t.Parallel()
	for state, final := range map[client.State]bool{
		client.StatusQueued: false, client.StatusInFlight: false, client.StatusUnknown: false,
		client.StatusDelivered: true, client.StatusDeadLettered: true,
	} {
		if got := (client.Status{State: state}).Final(); got != final {
			t.Errorf("Status{State: %s}.Final() = %v; want %v", state, got, final)
		}
	}
}

// waitParam reads a long poll's ?wait, failing the test when it is missing.
func waitParam(t testing.TB, rawQuery string) time.Duration {
	t.Helper()
	query, _ := url.ParseQuery(rawQuery)
	d, err := time.ParseDuration(query.Get("wait"))
	if err != nil || d <= 0 {
		t.Errorf("wait = %q; want a positive Go duration", query.Get("wait"))
	}
	return d
}

func TestWaitReturnsWhenDelivered(t *testing.T) {
	t.Parallel()
	ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
		states := []client.State{client.StatusQueued, client.StatusQueued, client.StatusInFlight, client.StatusDelivered}
		writeJSON(w, http.StatusOK, map[string]any{"id": "req-1", "status": states[min(n, len(states))-1], "attempts": 1, "ravenStatus": 200})
	})
	c := newTestClient(t, ingest)

	s, err := c.Wait(testContext(t, 10*time.Second), "penguin-7", "req-1")
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if s.State != client.StatusDelivered || s.RavenStatus != 200 {
		t.Errorf("Wait = %+v; want delivered", s)
	}
	calls := ingest.Calls()
	if len(calls) != 4 {
		t.Errorf("ingest got %d calls; want 4 (queued and in_flight are not final)", len(calls))
	}
	for _, call := range calls {
		if call.path != "/v1/requests/req-1" {
			t.Errorf("asked for %s; want /v1/requests/req-1", call.path)
		}
		if d := waitParam(t, call.query); d > 9*time.Second {
			t.Errorf("asked for wait=%v with 10s left; want room for the answer", d)
		}
	}
}

// In a synctest bubble: the http.Client's 4 s timeout is the bubble's.
func TestWaitPollFitsHTTPClientTimeout(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ingest := newBubbleIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
			writeJSON(w, http.StatusOK, map[string]any{"id": "req-1", "status": "delivered"})
		})
		c := newTestClient(t, ingest, client.WithHTTPClient(&http.Client{Timeout: 4 * time.Second, Transport: ingest.rt}))

		if _, err := c.Wait(context.Background(), "penguin-7", "req-1"); err != nil {
			t.Fatalf("Wait: %v", err)
		}
		if wait := waitParam(t, ingest.Calls()[0].query); wait != 2*time.Second {
			t.Errorf("wait = %v; want half the http.Client's 4s timeout", wait)
		}
	})
}

func TestWaitRetriesOn503(t *testing.T) {
	t.Parallel()
	ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
		switch n {
		case 1:
			writeProblem(w, http.StatusServiceUnavailable, "not_ready", "0")
		case 2:
			dropConnection(t, w)
		default:
			writeJSON(w, http.StatusOK, map[string]any{"id": "req-1", "status": "delivered"})
		}
	})
	c := newTestClient(t, ingest)

	s, err := c.Wait(testContext(t, 10*time.Second), "penguin-7", "req-1")
	if err != nil || s.State != client.StatusDelivered {
		t.Errorf("Wait = %+v, %v; want delivered", s, err)
	}
	if n := len(ingest.Calls()); n != 3 {
		t.Errorf("ingest got %d calls; want 3", n)
	}
}

func TestWaitContextEnds(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ingest := newBubbleIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
			hold := 50 * time.Millisecond // or less when asked, or nothing when the context is nearly over
			if wait := r.URL.Query().Get("wait"); wait == "" {
				hold = 0
			} else if d, err := time.ParseDuration(wait); err == nil {
				hold = min(hold, d)
			}
			select {
			case <-time.After(hold):
			case <-r.Context().Done():
			}
			writeJSON(w, http.StatusOK, map[string]any{"id": "req-1", "status": "queued", "attempts": n})
		})
		c := newTestClient(t, ingest)

		s, err := c.Wait(testContext(t, 300*time.Millisecond), "penguin-7", "req-1")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Wait error = %v; want context.DeadlineExceeded", err)
		}
		if s.State != client.StatusQueued || s.Attempts < 1 {
			t.Errorf("Wait status = %+v; want the last one seen, queued", s)
		}
	})
}

func TestWaitDoesNotRetryBadID(t *testing.T) {
	t.Parallel()
	ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
		writeProblem(w, http.StatusBadRequest, "id_invalid", "")
	})
	c := newTestClient(t, ingest)

	_, err := c.Wait(testContext(t, 10*time.Second), "penguin-7", "not an id")
	var p *client.Problem
	if !errors.As(err, &p) || p.Code != "id_invalid" {
		t.Errorf("Wait error = %v; want the id_invalid problem", err)
	}
	if n := len(ingest.Calls()); n != 1 {
		t.Errorf("ingest got %d calls; want 1", n)
	}
}

func TestProblemRetryAfter(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		header   func() string
		min, max time.Duration
	}{
		"Seconds":  {header: func() string { return "7" }, min: 7 * time.Second, max: 7 * time.Second},
		"HTTPDate": {header: func() string { return time.Now().Add(3 * time.Second).UTC().Format(http.TimeFormat) }, min: 3 * time.Second, max: 3 * time.Second},
		"Garbage":  {header: func() string { return "soon" }},
		"Negative": {header: func() string { return "-3" }},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// In a synctest bubble, whose clock starts on a whole second and stands
			// still while nothing waits: an HTTP date 3 s ahead is 3 s ahead exactly
			// when the answer is read.
			synctest.Test(t, func(t *testing.T) {
				ingest := newBubbleIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
					writeProblem(w, http.StatusTooManyRequests, "backlog_full", tc.header())
				})
				c := newTestClient(t, ingest, client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
				_, err := c.Status(testContext(t, 10*time.Second), "penguin-7", "req-1")
				var p *client.Problem
				if !errors.As(err, &p) {
					t.Fatalf("Status error = %v; want a *Problem", err)
				}
				if p.RetryAfter < tc.min || p.RetryAfter > tc.max {
					t.Errorf("RetryAfter = %v; want within [%v, %v]", p.RetryAfter, tc.min, tc.max)
				}
				if want := "ingest answered 429 backlog_full: detail of backlog_full"; p.Error() != want {
					t.Errorf("Error() = %q; want %q", p.Error(), want)
				}
			})
		})
	}
}

// Do whose submit fails says with which Idempotency-Key it sent the request (it may
// have been stored all the same), and Do again with that key sends the same key: the
// request is stored at most once. Do used to drop the key it made.
func TestDoThatCouldNotSubmitGivesItsKey(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	up := false
	ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
		mu.Lock()
		isUp := up
		mu.Unlock()
		switch {
		case !isUp:
			writeProblem(w, http.StatusServiceUnavailable, "overloaded", "")
		case r.Method == http.MethodPost:
			writeJSON(w, http.StatusAccepted, map[string]any{"id": "req-1", "clientId": "penguin-7", "status": "queued", "duplicate": true})
		default:
			writeJSON(w, http.StatusOK, map[string]any{"id": "req-1", "clientId": "penguin-7", "status": "delivered"})
		}
	})
	c := newTestClient(t, ingest)
	_, err := c.Do(testContext(t, 200*time.Millisecond), "penguin-7", []byte(`{}`))
	var ns *client.NotSubmittedError
	if !errors.As(err, &ns) {
		t.Fatalf("Do with ingest refusing: %v; want a *NotSubmittedError", err)
	}
	calls := ingest.Calls()
	sent := calls[len(calls)-1].header.Get("Idempotency-Key")
	if ns.Receipt.IdempotencyKey == "" || ns.Receipt.IdempotencyKey != sent || ns.Unwrap() == nil {
		t.Fatalf("Do's error carries key %q (and %v), want the key it sent, %q", ns.Receipt.IdempotencyKey, ns.Unwrap(), sent)
	}
	mu.Lock()
	up = true
	mu.Unlock()
	st, err := c.Do(testContext(t, 10*time.Second), "penguin-7", []byte(`{}`), client.WithIdempotencyKey(ns.Receipt.IdempotencyKey))
	if err != nil || st.State != client.StatusDelivered {
		t.Fatalf("Do again with the key: %+v, %v; want delivered", st, err)
	}
	for _, c := range ingest.Calls() {
		if c.method == http.MethodPost && c.header.Get("Idempotency-Key") != sent {
			t.Fatalf("a submit with key %q; every one should carry %q", c.header.Get("Idempotency-Key"), sent)
		}
	}
}
