package ingest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/natsnode"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// Bodies are read into buffers that are reused once their publish returned: under many
// concurrent callers, with bodies of every size and with and without a Content-Length,
// every stored request holds exactly the body that was accepted for its id.
func TestConcurrentBodiesAreStoredIntact(t *testing.T) {
	emb, q := embeddedQueue(t)
	ctx := context.Background()
	// A publish waits for its acknowledgement as long as a loaded machine may take:
	// this test is of the bodies stored, not of how fast they are.
	api, err := ingest.New(ingest.Config{PublishTimeout: 30 * time.Second}, q, q, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)

	const callers, each = 32, 40
	sent := make(map[string][]byte) // id -> body
	var mu sync.Mutex
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			for i := range each {
				pad := strings.Repeat(string(rune('a'+(c+i)%26)), (c*each+i)*37%9000)
				body := []byte(fmt.Sprintf(`{"clientId":"c%02d-%d","n":%d,"pad":%q}`, c, i%5, i, pad))
				var rd io.Reader = bytes.NewReader(body)
				if i%3 == 0 {
					rd = io.MultiReader(rd) // no Content-Length: sent chunked
				}
				resp, err := http.Post(srv.URL+"/v1/requests", "application/json", rd)
				if err != nil {
					t.Error(err)
					return
				}
				var a struct{ ID string }
				err = json.NewDecoder(resp.Body).Decode(&a)
				resp.Body.Close()
				if resp.StatusCode != http.StatusAccepted || err != nil {
					t.Errorf("answered %d (%v)", resp.StatusCode, err)
					return
				}
				mu.Lock()
				sent[a.ID] = body
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	nc, err := nats.Connect("", nats.InProcessServer(emb.Server()))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	stream, err := js.Stream(ctx, queue.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	stored := 0
	for seq := uint64(1); seq <= uint64(callers*each); seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		id := m.Header.Get(request.HeaderID)
		want, ok := sent[id]
		if !ok {
			t.Fatalf("message %d has id %q, which no caller was answered", seq, id)
		}
		if !bytes.Equal(m.Data, want) {
			t.Fatalf("request %s stored with a body of %d bytes that differs from the %d accepted", id, len(m.Data), len(want))
		}
		stored++
	}
	if stored != len(sent) {
		t.Fatalf("%d stored, %d accepted", stored, len(sent))
	}
}

// bareQueue starts an embedded JetStream server and opens the queue on it; nothing
// answers the asks a dispatcher would.
func bareQueue(t *testing.T) (*natsnode.Node, *queue.Queue) {
	t.Helper()
	emb, err := natsnode.StartEmbedded(natsnode.EmbeddedConfig{StoreDir: t.TempDir()}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emb.Server().Shutdown(); emb.Server().WaitForShutdown() })
	conn, err := queue.ConnectInProcess(emb.Server(), "test", zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	q, err := conn.Open(context.Background(), queue.Config{}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	return emb, q
}

// embeddedQueue is a bareQueue whose lookups are answered, as a dispatcher answers them.
func embeddedQueue(t *testing.T) (*natsnode.Node, *queue.Queue) {
	t.Helper()
	emb, q := bareQueue(t)
	// Without them a request with no record has a status that cannot be known (503).
	stop, err := q.ServeQueuedLookups()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return emb, q
}

// Waiting status reads are bounded: of two that ask to wait while only one may, one
// waits and the other is refused at once with 503 overloaded; the one waiting answers 200
// when the request becomes final, and its slot is free again once it did.
func TestStatusWaitsAreBounded(t *testing.T) {
	_, q := embeddedQueue(t)
	api, err := ingest.New(ingest.Config{Status: q, MaxStatusWaits: 1}, q, q, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	id := request.NewID(time.Now())
	url := srv.URL + "/v1/requests/" + id + "?clientId=c" // not final until the test says so: a read waits
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // after srv.Close, so it runs before it: a read left waiting ends
	get := func(url string) string {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err.Error()
		}
		var p struct {
			Code  string          // a problem's
			State json.RawMessage `json:"status"` // a status's state (a problem's is its number)
		}
		_ = json.NewDecoder(resp.Body).Decode(&p)
		resp.Body.Close()
		if p.Code != "" {
			return fmt.Sprint(resp.StatusCode, " ", p.Code)
		}
		state, _ := strconv.Unquote(string(p.State))
		return fmt.Sprint(resp.StatusCode, " ", state)
	}
	// Both ask to wait 30 s: whichever takes the slot holds it until the request is
	// final, so the other finds it taken however late it comes (within 30 s).
	codes := make(chan string, 2)
	for range 2 {
		go func() { codes <- get(url + "&wait=30s") }()
	}
	next := func(what string) string {
		select {
		case c := <-codes:
			return c
		case <-time.After(45 * time.Second):
			t.Fatalf("no answer within 45 s while awaiting %s", what)
			return ""
		}
	}
	if c := next("the refusal of one of two waiting reads"); c != "503 overloaded" {
		t.Fatalf("the first of two waiting reads with room for one to answer said %q, want 503 overloaded", c)
	}
	if err := q.WriteEvent(ctx, request.Event{Type: request.EventDelivered, ID: id, ClientID: "c"}); err != nil {
		t.Fatal(err)
	}
	if c := next("the waiting read's answer once the request was delivered"); c != "200 delivered" {
		t.Fatalf("the waiting read, once the request was delivered, answered %q, want 200 delivered", c)
	}
	if c := get(url + "&wait=30s"); c != "200 delivered" {
		t.Fatalf("a waiting read once the other ended answered %q, want 200 delivered (its slot free again)", c)
	}
}

// heldReads is the queue's status reads, the first of which is held until release is
// closed: a read in progress, holding its slot.
type heldReads struct {
	*queue.Queue
	held    chan struct{} // closed once the first read is being held
	release chan struct{}
	once    sync.Once
}

func (h *heldReads) StatusEvents(ctx context.Context, clientID, id string) ([]request.Event, error) {
	first := false
	h.once.Do(func() { first = true })
	if first {
		close(h.held)
		select {
		case <-h.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return h.Queue.StatusEvents(ctx, clientID, id)
}

// Status reads without ?wait are bounded too (issue 35, finding 3: 1,000 keep-alive
// readers took an ingest to 1.57 GB): while one is being read with room for one, another
// gets 503 overloaded at once with Retry-After; once the first answered, its slot is free.
func TestStatusReadsAreBounded(t *testing.T) {
	_, q := embeddedQueue(t)
	h := &heldReads{Queue: q, held: make(chan struct{}), release: make(chan struct{})}
	api, err := ingest.New(ingest.Config{Status: h, MaxStatusReads: 1}, q, q, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	released := sync.OnceFunc(func() { close(h.release) })
	t.Cleanup(srv.Close)
	t.Cleanup(released) // runs before srv.Close: the held read ends
	url := srv.URL + "/v1/requests/" + request.NewID(time.Now()) + "?clientId=c"
	first := make(chan int, 1)
	go func() {
		resp, err := http.Get(url)
		if err != nil {
			first <- 0
			return
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	<-h.held
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"overloaded"`) || !strings.Contains(string(body), "MAX_STATUS_READS") ||
		resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a read while the only slot is taken: %d %s (Retry-After %q), want 503 overloaded naming MAX_STATUS_READS", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	released()
	if code := <-first; code != http.StatusOK {
		t.Fatalf("the held read answered %d, want 200", code)
	}
	resp, err = http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a read once the slot was free again: %d, want 200", resp.StatusCode)
	}
}

// Batches in memory at once are bounded by their bytes: while one batch is being read,
// another that would pass the bound is refused with 503 overloaded before it is read;
// once the first is done, the same batch is taken.
func TestBatchBytesInFlightAreBounded(t *testing.T) {
	_, q := embeddedQueue(t)
	api, err := ingest.New(ingest.Config{BatchMaxBytes: 1000, BatchInFlightBytes: 1500, BodyTimeout: time.Minute}, q, q, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	// The first batch's body says when the handler first reads it: it reads only once
	// the batch's bytes are counted in flight.
	reading := make(chan struct{})
	var once sync.Once
	handler := api.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Test-First") != "" {
			r.Body = &onFirstRead{ReadCloser: r.Body, f: func() { once.Do(func() { close(reading) }) }}
		}
		handler.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	batch := func(n int) []byte {
		item := `{"clientId":"c","body":{"pad":"` + strings.Repeat("x", n-48) + `"}}`
		return []byte("[" + item + "]")
	}
	post := func(body io.Reader, size int64, first bool) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/requests/batch", body)
		req.ContentLength = size
		req.Header.Set("Content-Type", "application/json")
		if first {
			req.Header.Set("X-Test-First", "1")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		var p struct{ Code string }
		_ = json.NewDecoder(resp.Body).Decode(&p)
		return resp.StatusCode, p.Code
	}
	// The first batch, 900 bytes, arrives slowly: half now, the rest when told.
	first := batch(900)
	pr, pw := io.Pipe()
	// Registered after srv.Close, so it runs before it: a failure below leaves no
	// handler waiting for the rest of the first batch, which srv.Close would wait for.
	t.Cleanup(func() { pw.CloseWithError(errors.New("the test ended")) })
	firstDone := make(chan string, 1)
	go func() { code, what := post(pr, int64(len(first)), true); firstDone <- fmt.Sprint(code, " ", what) }()
	go func() { _, _ = pw.Write(first[:450]) }()
	select {
	case <-reading:
	case s := <-firstDone:
		t.Fatalf("the first batch answered %s before it was read whole", s)
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not start reading the first batch within 30 s")
	}
	second := batch(700)
	if code, what := post(bytes.NewReader(second), int64(len(second)), false); code != http.StatusServiceUnavailable || what != "overloaded" {
		t.Fatalf("a 700-byte batch beside 900 in flight (bound 1500): %d %s, want 503 overloaded", code, what)
	}
	// What can be refused before reading still is, full or not: no retry would help it.
	wrongType, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/requests/batch", bytes.NewReader(second))
	wrongType.Header.Set("Content-Type", "text/plain")
	if resp, err := http.DefaultClient.Do(wrongType); err != nil || resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Fatalf("a text/plain batch while the bound is reached: %v %v, want 415", resp, err)
	}
	if _, err := pw.Write(first[450:]); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	select {
	case s := <-firstDone:
		if s != "200 " {
			t.Fatalf("the first batch: %s, want 200", s)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the first batch was not answered within 30 s of its last byte")
	}
	if code, what := post(bytes.NewReader(second), int64(len(second)), false); code != http.StatusOK {
		t.Fatalf("the 700-byte batch once the first was done: %d %s, want 200", code, what)
	}
}

// onFirstRead calls f when its body is first read.
type onFirstRead struct {
	io.ReadCloser
	f func()
}

func (r *onFirstRead) Read(p []byte) (int, error) {
	r.f()
	return r.ReadCloser.Read(p)
}

// An NDJSON batch larger than a line reader's first buffer (4 KiB) stores every item as
// it was sent: each accepted id holds its own item's client and body.
func TestLargeNDJSONBatchStoresEachItemAsSent(t *testing.T) {
	emb, q := embeddedQueue(t)
	api, err := ingest.New(ingest.Config{}, q, q, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	const n = 100
	var batch bytes.Buffer
	bodies := make([]string, n)
	for i := range n {
		bodies[i] = fmt.Sprintf(`{"n":"%03d","pad":"%s"}`, i, strings.Repeat("x", 80))
		fmt.Fprintf(&batch, `{"clientId":"c-%03d","body":%s}`+"\n", i, bodies[i])
	}
	resp, err := http.Post(srv.URL+"/v1/requests/batch", "application/x-ndjson", &batch)
	if err != nil {
		t.Fatal(err)
	}
	var ans struct {
		Results []struct {
			Index  int
			Status string
			ID     string
		}
		Accepted int
	}
	err = json.NewDecoder(resp.Body).Decode(&ans)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || ans.Accepted != n {
		t.Fatalf("batch answered %d, %d accepted (%v)", resp.StatusCode, ans.Accepted, err)
	}
	nc, err := nats.Connect("", nats.InProcessServer(emb.Server()))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	stream, err := js.Stream(context.Background(), queue.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]*jetstream.RawStreamMsg{}
	for seq := uint64(1); seq <= n; seq++ {
		m, err := stream.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		stored[m.Header.Get(request.HeaderID)] = m
	}
	for _, res := range ans.Results {
		m := stored[res.ID]
		if m == nil {
			t.Fatalf("item %d: id %s was answered queued but is not stored", res.Index, res.ID)
		}
		if string(m.Data) != bodies[res.Index] || request.ClientToken(m.Subject) != request.EncodeClientID(fmt.Sprintf("c-%03d", res.Index)) {
			t.Fatalf("item %d (id %s) stored on %s with body %s; want client c-%03d and body %s", res.Index, res.ID, m.Subject, m.Data, res.Index, bodies[res.Index])
		}
	}
}

// countedRecord is the queue's record of events: its reads and the watches started
// through it counted. With hideDelivered its reads leave delivered events out (a record
// that has not caught up yet), so that only a watch can hear of a delivery.
type countedRecord struct {
	*queue.Queue
	hideDelivered  bool
	reads, watches atomic.Int32
}

func (c *countedRecord) StatusEvents(ctx context.Context, clientID, id string) ([]request.Event, error) {
	c.reads.Add(1)
	events, err := c.Queue.StatusEvents(ctx, clientID, id)
	if c.hideDelivered {
		events = slices.DeleteFunc(events, func(e request.Event) bool { return e.Type == request.EventDelivered })
	}
	return events, err
}

func (c *countedRecord) WatchEvents(clientID, id string, fn func(request.Event)) (func(), error) {
	c.watches.Add(1)
	return c.Queue.WatchEvents(clientID, id, fn)
}

// A POST with Prefer: wait hears its new request's events from a watch started before
// the request is stored, and answers its final status from them without reading the
// record: the reads were a millisecond or two on every waiting POST's path (issue 31's
// p99 of 5 ms). It read the record first, and again at each event, before.
func TestPreferWaitAnswersANewRequestFromWhatItHeard(t *testing.T) {
	emb, q := embeddedQueue(t)
	reads := &countedRecord{Queue: q}
	url := serveIngest(t, ingest.Config{Status: reads}, q)
	nc := connectIn(t, emb)
	id := request.IDFromKey("", "carl", "k-1")
	// The dispatcher's part: the request's delivered event, once the POST waits for it.
	ev := request.Event{Type: request.EventDelivered, ID: id, ClientID: "carl", At: time.Now(), Attempt: 1, Status: 201,
		Response: request.NewResponse(201, nil, nil, []byte(`{"ok":true}`), false)}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				publishEvent(nc, ev)
			}
		}
	}()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/requests", strings.NewReader(`{"n":1}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Client-Id", "carl")
	req.Header.Set("Idempotency-Key", "k-1")
	req.Header.Set("Prefer", "wait=20")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"status":"delivered"`) || !strings.Contains(string(body), `"acceptedAt"`) ||
		!strings.Contains(string(body), `{\"ok\":true}`) {
		t.Fatalf("POST with Prefer: wait: %d %s, want 200 delivered with its acceptance and raven's answer", resp.StatusCode, body)
	}
	if n := reads.reads.Load(); n != 0 {
		t.Fatalf("the wait read the record %d times; a new request's events are all heard", n)
	}
}

// A POST with Prefer: wait that sends a key again (a duplicate) reads the record, its
// request having perhaps ended before, and waits on the watch it started before the
// publish. It started a second watch for that read, and held both (two subscriptions on
// the server) for the whole wait.
func TestPreferWaitOnADuplicateWatchesOnce(t *testing.T) {
	emb, q := embeddedQueue(t)
	record := &countedRecord{Queue: q, hideDelivered: true}
	url := serveIngest(t, ingest.Config{Status: record}, q)
	post := func(ctx context.Context, prefer ...string) answer {
		return call(t, ctx, http.MethodPost, url+"/v1/requests", "", `{"n":1}`, append([]string{"X-Client-Id", "carl", "Idempotency-Key", "k-2"}, prefer...)...)
	}
	ctx := context.Background()
	if a := post(ctx); a.Code != http.StatusAccepted {
		t.Fatalf("first POST: %d %s", a.Code, a.Problem)
	}
	// No dispatcher runs: the request stays queued, and the wait ends after a second.
	if a := post(ctx, "Prefer", "wait=1"); a.Code != http.StatusAccepted || !a.Duplicate || a.PreferenceApplied != "wait=1" {
		t.Fatalf("the key sent again with Prefer: wait=1: %d duplicate=%v (Preference-Applied %q), want 202, a duplicate, its wait applied",
			a.Code, a.Duplicate, a.PreferenceApplied)
	}
	if n := record.watches.Load(); n != 1 {
		t.Fatalf("the duplicate's wait started %d watches of its request's events, want 1", n)
	}
	// Delivered while a duplicate waits: its answer is the final status, which only the
	// watch it started before the publish hears (the record's reads leave it out).
	nc := connectIn(t, emb)
	ev := request.Event{Type: request.EventDelivered, ID: request.IDFromKey("", "carl", "k-2"), ClientID: "carl", At: time.Now(), Attempt: 1, Status: 200}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		// Once the second waiting POST's watch is asked for, and again every 50 ms: the
		// count rises before the watch's subscription is on the server, and an event
		// published before that is not heard.
		for {
			if record.watches.Load() >= 2 {
				publishEvent(nc, ev)
			}
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	if a := post(ctx, "Prefer", "wait=20"); a.Code != http.StatusOK || string(a.Status) != `"delivered"` {
		t.Fatalf("the key sent again with Prefer: wait=20, delivered during the wait: %d %s, want 200 delivered", a.Code, a.Status)
	}
	if n := record.watches.Load(); n != 2 {
		t.Fatalf("two duplicates' waits started %d watches, want 2", n)
	}
}

// serveIngest serves ingest on q with cfg, and returns its URL.
func serveIngest(t *testing.T, cfg ingest.Config, q *queue.Queue) string {
	t.Helper()
	api, err := ingest.New(cfg, q, q, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

// connectIn is a plain NATS connection to the embedded server.
func connectIn(t *testing.T, emb *natsnode.Node) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect("", nats.InProcessServer(emb.Server()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// publishEvent publishes ev as a dispatcher writes it into the events stream.
func publishEvent(nc *nats.Conn, ev request.Event) {
	m := nats.NewMsg(ev.Subject())
	m.Header.Set(request.EventIDHeader, ev.ID)
	m.Data = ev.JSON()
	_ = nc.PublishMsg(m)
}
