package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/penguinhq/dispatcher/client"
	"github.com/penguinhq/dispatcher/integration/itest"
	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/ledger"
	"github.com/penguinhq/dispatcher/pkg/openapi"
	"github.com/penguinhq/dispatcher/pkg/openapi/openapitest"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// ingestBase is the stack's ingest API root.
func (s *stack) ingestBase() string { return strings.TrimSuffix(s.ingestURL, "/v1/requests") }

// apiClient is an http.Client whose every exchange with ingest is checked against the
// OpenAPI document: the real answers must match its schemas.
func apiClient(t testing.TB) *http.Client {
	return &http.Client{Timeout: 90 * time.Second, Transport: openapitest.NewChecker(t, openapi.Ingest()).Transport(t, nil)}
}

// goClient is the Go client against base, through apiClient, retrying quickly.
func goClient(t testing.TB, base string) *client.Client {
	t.Helper()
	c, err := client.New(base, client.WithHTTPClient(apiClient(t)), client.WithRetry(client.RetryPolicy{Base: 20 * time.Millisecond, Max: 500 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// accept records requests the test saw stored, for the ledger check.
func (s *stack) accept(clientID string, ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		s.accepted = append(s.accepted, ledger.Accepted{ClientID: clientID, ID: id})
	}
}

// postBatch sends body as a batch with Content-Type ct through the checked client.
func postBatch(t *testing.T, hc *http.Client, base, ct string, body []byte) (int, http.Header, map[string]any) {
	t.Helper()
	return postBatchWith(t, hc, base, http.Header{"Content-Type": {ct}}, body)
}

// postBatchWith is postBatch with these headers.
func postBatchWith(t *testing.T, hc *http.Client, base string, h http.Header, body []byte) (int, http.Header, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/requests/batch", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = h
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("batch answer %d is not JSON: %q", resp.StatusCode, raw)
	}
	return resp.StatusCode, resp.Header, out
}

// A batch with good, invalid, duplicate-key and backlog-full items: each item's result
// is right, only the good ones are stored (byte for byte) and delivered, in order and
// spaced.
func TestBatch(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{interval: 200 * time.Millisecond, noStart: true, queue: queuePerClientCap(3)})
	hc := apiClient(t)
	s.post("carol", 0) // carol has 1 queued: her batch items fill her cap of 3 and one more is refused
	items := []string{
		`{"clientId":"alice","body":{"n": 1,  "pad":"x"}}`,         // 0: good; its body's spacing is kept
		`{"clientId":"bob","body":[1,2,3],"idempotencyKey":"b-1"}`, // 1: good
		`{"body":{"n":2}}`, // 2: no clientId
		`{"clientId":"alice","body":{"n":3},"notBefore":"tomorrow"}`, // 3: bad not-before
		`{"clientId":"alice","body":{"n":4},"colour":"blue"}`,        // 4: unknown field
		`{"clientId":"bob","body":[1,2,3],"idempotencyKey":"b-1"}`,   // 5: bob's key again, same body: a duplicate
		`{"clientId":"alice","body":"two"}`,                          // 6: good, after 0
		`{"clientId":"carol","body":1}`,                              // 7: good (carol's 2nd)
		`{"clientId":"carol","body":2}`,                              // 8: good (3rd: her cap)
		`{"clientId":"carol","body":3}`,                              // 9: backlog full
		`{"clientId":"dave"}`,                                        // 10: no body
		`[1]`,                                                        // 11: not an object
	}
	code, header, ans := postBatch(t, hc, s.ingestBase(), "application/json", []byte("[\n"+strings.Join(items, ",\n")+"\n]"))
	if code != http.StatusOK {
		t.Fatalf("batch: %d %v", code, ans)
	}
	results := ans["results"].([]any)
	if len(results) != len(items) || ans["accepted"] != 6.0 || ans["failed"] != 6.0 {
		t.Fatalf("batch: %v, want %d results, 6 accepted, 6 failed", ans, len(items))
	}
	want := map[int]string{2: "client_id_missing", 3: "not_before_invalid", 4: "item_invalid", 9: "backlog_full", 10: "body_missing", 11: "item_invalid"}
	ids := map[int]string{}
	for i, r := range results {
		r := r.(map[string]any)
		if r["index"] != float64(i) {
			t.Fatalf("result %d has index %v", i, r["index"])
		}
		if code, bad := want[i]; bad {
			p, _ := r["problem"].(map[string]any)
			if r["status"] != "failed" || p == nil || p["code"] != code || p["detail"] == "" {
				t.Errorf("item %d: %v, want failed with %s", i, r, code)
			}
			continue
		}
		if r["status"] != "queued" || r["id"] == "" {
			t.Errorf("item %d: %v, want queued with an id", i, r)
		}
		ids[i], _ = r["id"].(string)
	}
	if p := results[9].(map[string]any)["problem"].(map[string]any); p["status"] != 429.0 || p["retryAfter"] != 1.0 || header.Get("Retry-After") != "1" {
		t.Errorf("backlog-full item: %v, Retry-After %q; want 429 with retryAfter 1 (the 200ms interval, in whole seconds)", p, header.Get("Retry-After"))
	}
	if r := results[5].(map[string]any); ids[5] != ids[1] || r["duplicate"] != true {
		t.Errorf("bob's key again: %v, want bob's first id %s as a duplicate", r, ids[1])
	}
	// Stored byte for byte: alice's head is item 0's body as it stood in the batch.
	subject, n, _, err := s.q.ClientLane(context.Background(), "alice")
	if err != nil || n != 2 {
		t.Fatalf("alice: %d queued (%v), want 2", n, err)
	}
	head, _, err := s.q.Head(context.Background(), subject)
	if err != nil || string(head.Body) != `{"n": 1,  "pad":"x"}` || head.ID != ids[0] || head.ContentType != "application/json" {
		t.Fatalf("alice's head: %q %s %q (%v), want item 0's body byte for byte", head.Body, head.ID, head.ContentType, err)
	}
	s.accept("alice", ids[0], ids[6])
	s.accept("bob", ids[1])
	s.accept("carol", ids[7], ids[8])

	// The same batch as NDJSON: a line that is not JSON is that item's problem only.
	code, _, ans = postBatch(t, hc, s.ingestBase(), "application/x-ndjson", []byte(`{"clientId":"erin","body":{"k":1}}`+"\n{not json\n\n"+`{"clientId":"erin","body":{"k":2}}`+"\n"))
	results, _ = ans["results"].([]any)
	if code != http.StatusOK || len(results) != 3 || ans["accepted"] != 2.0 ||
		results[1].(map[string]any)["problem"].(map[string]any)["code"] != "malformed_json" {
		t.Fatalf("ndjson batch: %d %v, want 3 results, the middle one malformed_json", code, ans)
	}
	s.accept("erin", results[0].(map[string]any)["id"].(string), results[2].(map[string]any)["id"].(string))

	s.startDispatcher()
	s.finish(30*time.Second, 0)
	if got := s.ledger.Delivered(); got != 8 { // carol's first, the batch's 5 stored (bob's duplicate is one), erin's 2
		t.Fatalf("%d delivered, want 8", got)
	}
}

// A batch over its limits is refused whole with 413 and a detail naming the limit, and
// a malformed one with 400; nothing of either is stored.
func TestBatchLimits(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{noStart: true})
	api, err := ingest.New(ingest.Config{BatchMaxItems: 3, BatchMaxBytes: 1000}, s.q, s.q, testLog())
	if err != nil {
		t.Fatal(err)
	}
	srv := newHTTPServer(t, api.Handler())
	hc := apiClient(t)
	item := `{"clientId":"a","body":1}`
	for _, tc := range []struct {
		name, ct, body string
		status         int
		detail         string
	}{
		{"TooManyItems", "application/json", "[" + strings.Repeat(item+",", 3) + item + "]", 413, "limit of 3 items"},
		{"TooManyLines", "application/x-ndjson", strings.Repeat(item+"\n", 4), 413, "limit of 3 items"},
		{"TooManyBytes", "application/json", `[{"clientId":"a","body":"` + strings.Repeat("x", 1000) + `"}]`, 413, "limit of 1000 bytes"},
		{"NotAnArray", "application/json", item, 400, "JSON array"},
		{"Truncated", "application/json", "[" + item + "," + item, 400, "not"},
		{"Empty", "application/json", "[]", 400, "no items"},
		{"NotJSON", "text/plain", item, 415, "x-ndjson"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, ans := postBatch(t, hc, srv, tc.ct, []byte(tc.body))
			if code != tc.status || !strings.Contains(fmt.Sprint(ans["detail"]), tc.detail) {
				t.Fatalf("%d %v, want %d with a detail saying %q", code, ans, tc.status, tc.detail)
			}
		})
	}
	if n := s.queued(); n != 0 {
		t.Fatalf("%d requests stored from refused batches, want none", n)
	}
}

// The Go client against an ingest that can store one request at a time (MAX_PUBLISHING
// 1) and 200 submits at once: every request is stored once and delivered once.
func TestClientAgainstOverloadedIngest(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{interval: 50 * time.Millisecond})
	api, err := ingest.New(ingest.Config{MaxPublishing: 1}, s.q, s.q, testLog())
	if err != nil {
		t.Fatal(err)
	}
	c := goClient(t, newHTTPServer(t, api.Handler()))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		wg.Go(func() {
			client := fmt.Sprintf("c%d", i) // one each: concurrent submits of one client have no order to check
			r, err := c.Submit(ctx, client, fmt.Appendf(nil, `{"i":%d}`, i))
			if err != nil {
				errs <- err
				return
			}
			s.accept(client, r.ID)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("submit: %v", err)
	}
	if got := s.acceptedCount(); got != 200 {
		t.Fatalf("%d stored, want 200", got)
	}
	s.finish(60*time.Second, 0)
}

// A client at its backlog cap: Submit waits out the 429s and succeeds once the backlog
// drains; the requests go in the order submitted.
func TestClientWaitsOutAFullBacklog(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{interval: 300 * time.Millisecond, queue: queuePerClientCap(2)})
	c := goClient(t, s.ingestBase())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 6 {
		r, err := c.Submit(ctx, "frank", fmt.Appendf(nil, `{"i":%d}`, i))
		if err != nil {
			t.Fatalf("submit %d: %v", i, err)
		}
		s.accept("frank", r.ID)
	}
	s.finish(30*time.Second, 0)
}

// Ingest restarted in the middle of a run: the client rides it out; nothing is lost and
// nothing stored twice.
func TestClientAcrossIngestRestart(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{interval: 50 * time.Millisecond})
	addr := freeAddr(t)
	start := func() *http.Server {
		api, err := ingest.New(ingest.Config{}, s.q, s.q, testLog())
		if err != nil {
			t.Fatal(err)
		}
		var ln net.Listener
		waitFor(t, time.Minute, "the ingest address to be free", func() bool { ln, err = net.Listen("tcp", addr); return err == nil })
		srv := &http.Server{Handler: api.Handler()}
		go func() { _ = srv.Serve(ln) }()
		return srv
	}
	srv := start()
	c := goClient(t, "http://"+addr)
	// A bound on a hang, not a verdict: beside a second CI run the 200 submits took
	// longer than a minute, and the last one ended at the deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var sent atomic.Int64
	for w := range 4 {
		wg.Go(func() {
			for i := range 50 {
				client := fmt.Sprintf("w%d", w)
				r, err := c.Submit(ctx, client, fmt.Appendf(nil, `{"i":%d}`, i))
				if err != nil {
					t.Errorf("submit: %v", err)
					return
				}
				sent.Add(1)
				s.accept(client, r.ID)
			}
		})
	}
	waitFor(t, time.Minute, "some submits", func() bool { return sent.Load() >= 40 })
	_ = srv.Close() // connections dropped mid-request, as a crash would
	time.Sleep(300 * time.Millisecond)
	srv = start()
	defer srv.Close()
	wg.Wait()
	if got := s.acceptedCount(); got != 200 {
		t.Fatalf("%d stored, want 200", got)
	}
	if n := s.storedEver(); n != 200 {
		t.Fatalf("the request stream stored %d requests, want 200: a retried submit was stored twice", n)
	}
	s.finish(60*time.Second, 0)
}

// storedEver is how many requests the request stream ever stored: its last sequence
// (the test writes only remove).
func (s *stack) storedEver() uint64 {
	s.t.Helper()
	js, err := jetstream.New(s.nc)
	if err != nil {
		s.t.Fatal(err)
	}
	stream, err := js.Stream(context.Background(), queue.RequestStream)
	if err != nil {
		s.t.Fatal(err)
	}
	info, err := stream.Info(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	return info.State.LastSeq
}

// newHTTPServer serves h on a loopback port until the test ends and returns its URL.
func newHTTPServer(t testing.TB, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

// A request's status through every state: unknown, queued, in flight, queued again after
// a failed attempt, delivered; the same after every process restarted and on a second
// ingest; ?wait answers at the moment of delivery.
func TestStatusThroughEveryState(t *testing.T) {
	t.Parallel()
	// Raven holds the first attempt until the test has seen it in flight: the state is
	// there to be seen however slow the machine (the send timeout is well above any wait).
	// It answers it 503 with a Retry-After of 10 s: the record stays as it is, after one
	// attempt, while the test reads it and stops that dispatcher. (The one started after
	// the restarts knows nothing of the Retry-After, and sends at once.)
	seenInFlight := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(seenInFlight) }) }
	var arrivals atomic.Int32
	s := newStack(t, options{interval: 200 * time.Millisecond, noStart: true, timeout: 5 * time.Minute, respond: func(a ledger.Arrival) ledger.Response {
		if arrivals.Add(1) == 1 {
			<-seenInFlight
			return ledger.Response{Status: 503, RetryAfter: "10"}
		}
		return ledger.Response{Status: 201}
	}})
	t.Cleanup(release) // registered after the stack's: runs before raven is closed
	// No dispatcher runs yet: whether a request without a record is queued cannot be
	// known, and the answer says so rather than unknown, a guess.
	fresh, err := itest.HTTP.Get(s.ingestBase() + "/v1/requests/" + request.NewID(time.Now()) + "?clientId=gina")
	if err != nil {
		t.Fatal(err)
	}
	var freshProblem struct{ Code string }
	_ = json.NewDecoder(fresh.Body).Decode(&freshProblem)
	fresh.Body.Close()
	if fresh.StatusCode != http.StatusServiceUnavailable || freshProblem.Code != "status_unavailable" || fresh.Header.Get("Retry-After") == "" {
		t.Fatalf("a fresh id with no dispatcher running: %d %q (Retry-After %q), want 503 status_unavailable with a Retry-After",
			fresh.StatusCode, freshProblem.Code, fresh.Header.Get("Retry-After"))
	}
	// From here the dispatchers' lookup is served, as a dispatcher does (no dispatcher
	// sends yet): the queued request has no stored event (ADR 18), and the lookup says it
	// is queued.
	stopLookups, err := s.q.ServeQueuedLookups()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopLookups)
	c := goClient(t, s.ingestBase())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var bad *client.Problem
	if _, err := c.Status(ctx, "gina", "not-an-id"); !errors.As(err, &bad) || bad.Code != "id_invalid" {
		t.Fatalf("a malformed id: %v, want id_invalid", err)
	}
	r, err := c.Submit(ctx, "gina", []byte(`{"g":1}`), client.WithIdempotencyKey("g-1"))
	if err != nil {
		t.Fatal(err)
	}
	s.accept("gina", r.ID)
	state := func(want client.State) client.Status {
		t.Helper()
		var st client.Status
		waitForState(t, time.Minute, "status "+string(want), func() (bool, string) {
			st, err = c.Status(ctx, r.ClientID, r.ID)
			return err == nil && st.State == want, fmt.Sprintf("%+v (%v)", st, err)
		})
		return st
	}
	st := state(client.StatusQueued)
	if st.Queue == nil || st.Queue.Backlog != 1 || !st.Queue.AtHead || st.ClientID != "gina" || st.AcceptedAt.IsZero() {
		t.Fatalf("queued: %+v, want gina's only request, at the head", st)
	}
	s.startDispatcher()
	state(client.StatusInFlight)
	// With a dispatcher to ask, an id the queue does not hold is unknown.
	if st, err := c.Status(ctx, "gina", request.NewID(time.Now())); err != nil || st.State != client.StatusUnknown {
		t.Fatalf("a fresh id: %+v %v, want unknown", st, err)
	}
	// Its clientId in another case names another client (clientIds are case-sensitive):
	// Wait says at once that ingest holds no such request for it, naming the clientId.
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	start := time.Now()
	_, err = c.Wait(wctx, "Gina", r.ID)
	wcancel()
	if !errors.Is(err, client.ErrNoSuchRequest) || !strings.Contains(err.Error(), `"Gina"`) || time.Since(start) > 10*time.Second {
		t.Fatalf("Wait with the clientId in another case: %v after %s, want ErrNoSuchRequest naming \"Gina\", at once", err, time.Since(start))
	}
	release()
	st = state(client.StatusQueued)
	if st.Attempts != 1 || st.LastAttempt == nil || st.LastAttempt.Status != 503 {
		t.Fatalf("after the failed attempt: %+v, want 1 attempt that raven answered 503", st)
	}

	// Every process restarts: the dispatcher, ingest (a new one on a new connection), NATS.
	s.stopDispatcher()
	s.stopNATS()
	s.restartNATS()
	second := s.secondIngest(t)
	c2 := goClient(t, second)
	waitForState(t, time.Minute, "the record after the restarts to say queued after 1 attempt", func() (bool, string) {
		after, err := c2.Status(ctx, r.ClientID, r.ID)
		return err == nil && after.State == client.StatusQueued && after.Attempts == 1, fmt.Sprintf("%+v (%v)", after, err)
	})

	// ?wait: held until delivery, answered then.
	s.startDispatcher()
	waited := make(chan client.Status, 1)
	go func() {
		st, err := c2.Wait(ctx, r.ClientID, r.ID)
		if err != nil {
			t.Errorf("wait: %v", err)
		}
		waited <- st
	}()
	st = <-waited
	answered := time.Now()
	delivered := s.ledger.LastDelivered()
	// (Attempts is the highest attempt number: the dispatcher started after the restarts
	// numbers its first attempt 1 again, the attempt count being its own memory.)
	if st.State != client.StatusDelivered || st.RavenStatus != 201 || st.Attempts < 1 || st.DeliveredAt.IsZero() {
		t.Fatalf("waited: %+v, want delivered with raven's 201", st)
	}
	// A wait that answered only when its poll ended would answer up to client.MaxWaitPoll
	// (30 s) late; the path from raven's 2xx (an event written, heard, answered over
	// HTTP) takes milliseconds, and half the poll leaves a loaded machine room.
	if lag := answered.Sub(delivered); lag > client.MaxWaitPoll/2 {
		t.Fatalf("the wait answered %s after raven's 2xx: it did not answer at the moment of delivery", lag)
	}
	for _, cl := range []*client.Client{c, c2} {
		if st, err := cl.Status(ctx, r.ClientID, r.ID); err != nil || st.State != client.StatusDelivered {
			t.Fatalf("status on each ingest: %+v %v, want delivered", st, err)
		}
	}
	s.finish(15*time.Second, 0)
}

// secondIngest starts another ingest on its own NATS connection and returns its URL.
func (s *stack) secondIngest(t testing.TB) string {
	t.Helper()
	nc := connectTo(t, s.srv.ClientURL())
	q := openQueue(t, nc)
	api, err := ingest.New(ingest.Config{Status: q, Live: q, Instance: "ingest-2"}, q, q, testLog())
	if err != nil {
		t.Fatal(err)
	}
	return newHTTPServer(t, api.Handler())
}

// queuePerClientCap is a queue whose clients may each have n requests queued.
func queuePerClientCap(n int64) queue.Config { return queue.Config{BacklogCap: n} }

// openQueue opens the queue, as it stands, on nc.
func openQueue(t testing.TB, nc *nats.Conn) *queue.Queue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q, err := queue.Open(ctx, nc, queue.Config{}, queue.Existing)
	if err != nil {
		t.Fatal(err)
	}
	return q
}
