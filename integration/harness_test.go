// Package integration runs the service's real parts together: an embedded nats-server,
// the queue, ingest and the dispatcher (in process, or as built binaries), and a recording
// raven (pkg/ledger) that every test checks at its end against the guarantees in
// ARCHITECTURE.md.
package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/penguinhq/dispatcher/integration/itest"
	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/fault"
	"github.com/penguinhq/dispatcher/pkg/governor"
	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/ledger"
	"github.com/penguinhq/dispatcher/pkg/natsnode"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/raven"
	"github.com/penguinhq/dispatcher/pkg/record"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// testLog writes warnings to stderr when DISPATCH_TEST_LOG is set, else nothing.
func testLog() zerolog.Logger {
	if os.Getenv("DISPATCH_TEST_LOG") == "" {
		return zerolog.Nop()
	}
	return zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).Level(zerolog.DebugLevel).With().Timestamp().Logger()
}

// testLogAlso is testLog that also writes the lines at info and above, as JSON, to w.
func testLogAlso(w io.Writer) zerolog.Logger {
	keep := &zerolog.FilteredLevelWriter{Writer: zerolog.LevelWriterAdapter{Writer: w}, Level: zerolog.InfoLevel}
	if os.Getenv("DISPATCH_TEST_LOG") == "" {
		return zerolog.New(keep).Level(zerolog.InfoLevel)
	}
	return zerolog.New(zerolog.MultiLevelWriter(zerolog.ConsoleWriter{Out: os.Stderr}, keep)).Level(zerolog.DebugLevel).With().Timestamp().Logger()
}

type options struct {
	interval time.Duration
	queue    queue.Config
	policy   schedule.Policy
	timeout  time.Duration // raven timeout
	respond  func(ledger.Arrival) ledger.Response
	noStart  bool // do not start the dispatcher
	budget   governor.Budget
	natsURL  string // use this NATS (a cluster) instead of starting a server
	// ravenProxy puts a fault proxy between the dispatcher and raven (stack.ravenProxy).
	ravenProxy bool
	// tracing, if not nil, traces ingest and the dispatcher.
	tracing trace.TracerProvider
	// leaseTTL is the dispatchers' LEASE_TTL in a cluster stack; clusterLeaseTTL when zero.
	leaseTTL time.Duration
}

// stack is one service on one embedded NATS server, with a recording raven.
type stack struct {
	t          testing.TB
	opts       options
	srv        *server.Server
	node       *natsnode.Node // srv's: stopNATS stops it
	natsDir    string
	natsAddr   string
	nc         *nats.Conn
	q          *queue.Queue
	ledger     *ledger.Ledger
	ravenURL   string
	ravenProxy *fault.Proxy // with options.ravenProxy
	ingestURL  string
	events     *record.Writer
	http       *http.Client // to ingest: every exchange checked against the OpenAPI document

	mu          sync.Mutex
	accepted    []ledger.Accepted
	unavailable int                  // 503 answers: their requests may have been stored all the same
	replayed    map[string]bool      // ids replayed from the dead-letter stream
	cancelled   map[string]time.Time // ids a cancel was answered cancelled for: when it was asked

	// attemptsOnce makes the ledger check that no attempt arrived twice: for tests in
	// which one dispatcher runs throughout.
	attemptsOnce bool

	stopDispatch func()
	metrics      *prometheus.Registry // the running dispatcher's
	dispatchLog  itest.Buffer         // what the dispatchers logged at info and above, as JSON lines
}

func newStack(t testing.TB, o options) *stack {
	t.Helper()
	if o.interval == 0 {
		o.interval = 100 * time.Millisecond
	}
	if o.timeout == 0 {
		o.timeout = 5 * time.Second
	}
	s := &stack{t: t, opts: o, http: apiClient(t)}
	if o.natsURL == "" {
		s.natsDir = t.TempDir()
		s.node = queuetest.NodeAt(t, s.natsDir, "127.0.0.1:0")
		s.srv = s.node.Server()
		s.natsAddr = strings.TrimPrefix(s.srv.ClientURL(), "nats://")
		o.natsURL = s.srv.ClientURL()
	}
	s.nc = connectTo(t, o.natsURL)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q, err := queuetest.Open(ctx, s.nc, o.queue, queue.CreateOrUpdate)
	if err != nil {
		t.Fatalf("opening queue: %v", err)
	}
	s.q = q
	s.ledger = ledger.New(ledger.Options{Respond: o.respond})
	rs := httptest.NewUnstartedServer(s.ledger)
	rs.Config.ConnContext = s.ledger.ConnContext
	rs.Start()
	t.Cleanup(rs.Close)
	s.ravenURL = rs.URL
	if o.ravenProxy {
		p, err := fault.New(strings.TrimPrefix(rs.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		s.ravenProxy, s.ravenURL = p, "http://"+p.Addr()
	}

	// The dispatchers' event writer; ingest announces its accepted events live (ADR 18).
	s.events = q.NewEventWriter("test", 0, nil, testLog())
	evCtx, stopEvents := context.WithCancel(context.Background())
	evDone := make(chan struct{})
	go func() { defer close(evDone); s.events.Run(evCtx, 2*time.Second) }()
	t.Cleanup(func() { stopEvents(); <-evDone })

	api, err := ingest.New(ingest.Config{MaxBodyBytes: 4096, BacklogRetryAfter: o.interval, Live: q, Status: q, Instance: "ingest",
		Tracing: o.tracing}, q, q, testLog())
	if err != nil {
		t.Fatal(err)
	}
	is := httptest.NewServer(api.Handler())
	t.Cleanup(is.Close)
	s.ingestURL = is.URL + "/v1/requests"
	if !o.noStart {
		s.startDispatcher()
	}
	t.Cleanup(s.stopDispatcher)
	return s
}

func (s *stack) policy() schedule.Policy {
	p := s.opts.policy
	p.Interval = s.opts.interval
	if p.BackoffBase == 0 {
		p.BackoffBase = s.opts.interval / 2
	}
	if p.BackoffMax == 0 {
		p.BackoffMax = 4 * s.opts.interval
	}
	return p
}

// startDispatcher runs a dispatcher in this process until stopDispatcher.
func (s *stack) startDispatcher() {
	s.t.Helper()
	// Raven's answers kept as the binary keeps them by default.
	rc, err := raven.New(raven.Config{URL: s.ravenURL, Timeout: s.opts.timeout, KeepBytes: raven.DefaultKeepBytes, KeepHeaders: raven.DefaultKeepHeaders})
	if err != nil {
		s.t.Fatal(err)
	}
	ctl, err := s.q.Control(context.Background(), testLog())
	if err != nil {
		s.t.Fatal(err)
	}
	// As the dispatcher binary runs it: steered by the control bucket, counted, and
	// answering operators' questions.
	s.metrics = prometheus.NewRegistry()
	log := testLogAlso(&s.dispatchLog)
	d, err := dispatch.New(dispatch.Config{Policy: s.policy(), ShutdownGrace: 5 * time.Second, Budget: s.opts.budget,
		Steering: ctl, InstanceID: "test", Metrics: dispatch.NewMetrics(s.metrics), Events: s.events, Attempts: s.q, Tracing: s.opts.tracing}, s.q, rc, log)
	if err != nil {
		s.t.Fatal(err)
	}
	stopQuestions, err := s.q.ServeQuestions("test", introspect.AnswersOf(d), log)
	if err != nil {
		s.t.Fatal(err)
	}
	stopLookups, err := s.q.ServeQueuedLookups()
	if err != nil {
		s.t.Fatal(err)
	}
	stopCancels, err := admin.ServeCancels(s.q, d, "test", log)
	if err != nil {
		s.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	waitFor(s.t, time.Minute, "the dispatcher to run", d.Running)
	s.stopDispatch = func() {
		stopCancels()
		stopLookups()
		stopQuestions()
		cancel()
		if err := <-done; err != nil {
			s.t.Errorf("dispatcher: %v", err)
		}
	}
}

// stopNATS stops the stack's NATS server, as an outage would.
func (s *stack) stopNATS() {
	s.node.Shutdown()
}

// restartNATS starts the stack's NATS server again on the same port and files.
func (s *stack) restartNATS() {
	s.t.Helper()
	s.node = queuetest.NodeAt(s.t, s.natsDir, s.natsAddr)
	s.srv = s.node.Server()
	waitFor(s.t, time.Minute, "the client to reconnect", s.nc.IsConnected)
}

func (s *stack) stopDispatcher() {
	if s.stopDispatch != nil {
		s.stopDispatch()
		s.stopDispatch = nil
	}
}

// answer is ingest's reply to one POST.
type answer struct {
	Status int
	Header http.Header
	Body   map[string]any
}

func (a answer) str(key string) string { s, _ := a.Body[key].(string); return s }

// postRaw sends one request to ingest and records it as accepted when it gets 202.
func (s *stack) postRaw(header http.Header, body []byte) answer {
	s.t.Helper()
	a, err := s.tryPost(header, body)
	if err != nil {
		s.t.Fatal(err)
	}
	return a
}

// cancel asks ingest to cancel request id of client (DELETE), and keeps a 200 for the
// ledger's check: raven must receive no attempt of it from the time it was asked.
func (s *stack) cancel(client, id string) answer {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodDelete, s.ingestURL+"/"+id+"?clientId="+url.QueryEscape(client), nil)
	if err != nil {
		s.t.Fatal(err)
	}
	asked := time.Now()
	resp, err := s.http.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	a := answer{Status: resp.StatusCode, Header: resp.Header}
	_ = json.NewDecoder(resp.Body).Decode(&a.Body)
	if a.Status == http.StatusOK && a.str("status") == "cancelled" {
		s.cancelledAsked(id, asked)
	}
	return a
}

// cancelledAsked keeps, for the ledger's check, that a cancel of id asked at asked was
// answered cancelled (the first such cancel counts).
func (s *stack) cancelledAsked(id string, asked time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancelled == nil {
		s.cancelled = map[string]time.Time{}
	}
	if _, ok := s.cancelled[id]; !ok {
		s.cancelled[id] = asked
	}
}

// tryPost is postRaw for goroutines other than the test's: it returns what went wrong.
func (s *stack) tryPost(header http.Header, body []byte) (answer, error) {
	req, err := http.NewRequest(http.MethodPost, s.ingestURL, bytes.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return answer{}, fmt.Errorf("posting to ingest: %w", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := answer{Status: resp.StatusCode, Header: resp.Header}
	if err := json.Unmarshal(raw, &a.Body); err != nil {
		return answer{}, fmt.Errorf("ingest answered %d with a body that is not JSON: %q", resp.StatusCode, raw)
	}
	s.mu.Lock()
	switch a.Status {
	case http.StatusAccepted, http.StatusOK: // 200: stored, and final within its Prefer: wait
		s.accepted = append(s.accepted, ledger.Accepted{ClientID: a.str("clientId"), ID: a.str("id")})
	case http.StatusServiceUnavailable:
		s.unavailable++
	}
	s.mu.Unlock()
	return a, nil
}

func jsonHeader() http.Header { return http.Header{"Content-Type": {"application/json"}} }

// post sends a JSON body for client (in the body's clientId) and requires a 202.
func (s *stack) post(client string, n int) string {
	s.t.Helper()
	body, _ := json.Marshal(map[string]any{"clientId": client, "n": n})
	a, err := s.postUntilTaken(jsonHeader(), body)
	if err != nil {
		s.t.Fatal(err)
	}
	if a.Status != http.StatusAccepted {
		s.t.Fatalf("post for %q: %d %v", client, a.Status, a.Body)
	}
	return a.str("id")
}

// postUntilTaken is tryPost sent again while ingest answers 503, for up to two minutes,
// as penguin is told to: on a loaded machine the store's acknowledgement can miss
// ingest's publish timeout. A request answered 503 may have been stored all the same
// and be delivered besides its retry; the ledger allows that once any 503 was counted
// (Expect.AllowUnacknowledged). (Without an Idempotency-Key: the tests' ids stay
// made from the time.)
func (s *stack) postUntilTaken(header http.Header, body []byte) (answer, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		a, err := s.tryPost(header, body)
		if err != nil || a.Status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			return a, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// queueDirect queues n requests for client straight into the queue, in one round trip
// and in order, and counts them as accepted: for a test that needs a backlog in place at
// a moment, which posts through ingest one by one cannot promise on a loaded machine.
func (s *stack) queueDirect(client string, n int) {
	s.t.Helper()
	reqs := make([]request.Request, n)
	for k := range reqs {
		reqs[k] = request.Request{ID: request.NewID(time.Now()), ClientID: client, ContentType: "application/json",
			Body: fmt.Appendf(nil, `{"clientId":%q,"n":%d}`, client, k)}
	}
	_, errs := s.q.PublishAll(context.Background(), reqs)
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, err := range errs {
		if err != nil {
			s.t.Fatalf("queueing %s's request %d: %v", client, k, err)
		}
		s.accepted = append(s.accepted, ledger.Accepted{ClientID: client, ID: reqs[k].ID})
	}
}

func (s *stack) acceptedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := map[string]bool{}
	for _, a := range s.accepted {
		ids[a.ID] = true
	}
	return len(ids)
}

func (s *stack) dead() map[string]bool {
	s.t.Helper()
	out := map[string]bool{}
	for _, r := range s.deadLetters() {
		out[r.ID] = true
	}
	return out
}

// deadLetters is every dead letter, oldest first. A read that fails (seen right after a
// partitioned node came back: "JetStream system temporarily unavailable") is tried again
// from the start, for up to 30 s.
func (s *stack) deadLetters() []request.DeadLetter {
	s.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var out []request.DeadLetter
		var failed error
		for r, err := range s.q.DeadLetters(context.Background(), queue.DeadFilter{}) {
			if err != nil {
				failed = err
				break
			}
			out = append(out, r)
		}
		if failed == nil {
			return out
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("reading dead letters: %v", failed)
		}
	}
}

// queued is how many requests the request stream holds. A question lost to a restart of
// the server the test's own connection uses (written to the old one's socket as it
// went) is asked again, for up to 20 s.
func (s *stack) queued() int {
	s.t.Helper()
	var backlog map[string]uint64
	for deadline := time.Now().Add(20 * time.Second); ; {
		var err error
		if backlog, err = s.q.Backlog(context.Background()); err == nil {
			break
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("listing backlog: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	n := 0
	for _, c := range backlog {
		n += int(c)
	}
	return n
}

// feed posts requests for clients from four goroutines, each pausing between posts,
// until the returned stop is called (or the test ends); each client's posts are
// sequential. Ingest must answer 202 or 503 only; the 503s are counted (stack.unavailable).
func (s *stack) feed(clients int, pause time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-done:
					return
				case <-time.After(pause):
				}
				client := clientName(g + 4*(n%(clients/4)))
				a, err := s.tryPost(jsonHeader(), fmt.Appendf(nil, `{"clientId":%q,"n":%d}`, client, n))
				if err != nil {
					s.t.Errorf("post during the run: %v", err)
					return
				}
				if a.Status != http.StatusAccepted && a.Status != http.StatusServiceUnavailable {
					s.t.Errorf("post during the run: %d %v, want 202 or 503", a.Status, a.Body)
					return
				}
			}
		})
	}
	var once sync.Once
	stop = func() { once.Do(func() { close(done); wg.Wait() }) }
	s.t.Cleanup(stop)
	return stop
}

// The helpers the integration test packages share.
var (
	waitFor      = itest.WaitFor
	waitForState = itest.WaitForState
	testHTTP     = itest.HTTP
	waitReady    = itest.WaitReady
	freeAddr     = itest.FreeAddr
	mustContain  = itest.MustContain
	clientName   = itest.ClientName
	readMetrics  = itest.ReadMetrics
	parseMetrics = itest.ParseMetrics
)

// waitDone waits until the queue is empty and every accepted request was delivered,
// dead-lettered or cancelled. The timeout bounds a hang, it does not judge speed: it is at least
// three minutes, whatever the caller says (beside another CI run, fault tests' last
// retries outlasted a minute and a half), and the wait says where it stands each 30 s. When it passes, the ledger is checked before the test
// fails, so that a lost request is reported as lost, not only as a wait that ended.
func (s *stack) waitDone(timeout time.Duration) {
	s.t.Helper()
	timeout = max(timeout, 3*time.Minute)
	began, told := time.Now(), time.Now()
	ok, seen := itest.Poll(timeout, func() (bool, string) {
		queued, delivered, dead, accepted := s.queued(), s.ledger.Delivered(), len(s.dead()), s.acceptedCount()
		s.mu.Lock()
		cancelled := len(s.cancelled)
		s.mu.Unlock()
		done, seen := queued == 0 && delivered+dead+cancelled >= accepted,
			fmt.Sprintf("%d queued, %d delivered, %d dead-lettered, %d cancelled, %d accepted", queued, delivered, dead, cancelled, accepted)
		if !done && time.Since(told) >= 30*time.Second {
			told = time.Now()
			s.t.Logf("still waiting after %s for every request to be delivered; seen: %s", time.Since(began).Round(time.Second), seen)
		}
		return done, seen
	})
	if !ok {
		s.check(-1)
		s.t.Fatalf("timed out after %s waiting for every accepted request to be delivered or dead-lettered; last seen: %s", timeout, seen)
	}
}

// with returns a copy of env with the given key-value pairs added.
func with(env map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range env {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// finish waits until every accepted request was delivered or dead-lettered and the queue
// is empty, stops the dispatcher, and checks the ledger. It returns the report.
func (s *stack) finish(timeout time.Duration, maxDuplicates int) ledger.Report {
	s.t.Helper()
	s.waitDone(timeout)
	s.stopDispatcher()
	return s.check(maxDuplicates)
}

func (s *stack) check(maxDuplicates int) ledger.Report {
	s.t.Helper()
	return s.checkLedger(maxDuplicates, nil)
}

// checkExplained checks the ledger, requiring every duplicate delivery to be explained by
// a removal failure in the dispatchers' logs.
func (s *stack) checkExplained(logs ...string) ledger.Report {
	s.t.Helper()
	explained, timedOut := s.fromLogs(logs...)
	return s.checkLedgerWith(-1, explained, timedOut)
}

func (s *stack) checkLedger(maxDuplicates int, explained map[string]bool) ledger.Report {
	s.t.Helper()
	return s.checkLedgerWith(maxDuplicates, explained, nil)
}

// checkLedgerWith checks the ledger; timedOut holds the attempts the dispatchers gave up
// on for want of an answer (fromLogs), measured from their start only.
func (s *stack) checkLedgerWith(maxDuplicates int, explained, timedOut map[string]bool) ledger.Report {
	s.t.Helper()
	s.mu.Lock()
	accepted := append([]ledger.Accepted(nil), s.accepted...)
	unavailable := s.unavailable
	cancelled := maps.Clone(s.cancelled)
	s.mu.Unlock()
	rep := s.ledger.Check(ledger.Expect{Interval: s.opts.interval, Accepted: accepted, Dead: s.dead(), Replayed: s.replayed, Cancelled: cancelled,
		AllowUnacknowledged: unavailable > 0, AttemptsOnce: s.attemptsOnce, Explained: explained, TimedOut: timedOut})
	s.t.Logf("ledger: %s", rep)
	for _, v := range rep.Violations {
		s.t.Errorf("guarantee broken: %s", v)
	}
	if maxDuplicates >= 0 && rep.Duplicates > maxDuplicates {
		s.t.Errorf("%d duplicate deliveries, want at most %d", rep.Duplicates, maxDuplicates)
	}
	return rep
}
