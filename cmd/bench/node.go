package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/cmd/internal/cli"
	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/natsnode"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/raven"
	"github.com/penguinhq/dispatcher/pkg/record"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// node is a fresh embedded JetStream server with the queue's streams.
type node struct {
	srv  *server.Server
	conn *queue.Conn // the service's connection
	nc   *nats.Conn  // a plain one, for the raw JetStream references
	q    *queue.Queue
	dir  string
}

func startNode(ctx context.Context, syncAlways bool, cfg queue.Config) (*node, error) {
	return startNodeListening(ctx, syncAlways, cfg, "")
}

// startNodeListening is startNode with the server also listening for NATS clients on
// listen (host:port; port -1 picks a free one), unless listen is empty.
func startNodeListening(ctx context.Context, syncAlways bool, cfg queue.Config, listen string) (*node, error) {
	dir, err := os.MkdirTemp("", "dispatch-bench-")
	if err != nil {
		return nil, err
	}
	emb, err := natsnode.StartEmbedded(natsnode.EmbeddedConfig{StoreDir: dir, SyncAlways: syncAlways, Listen: listen}, zerolog.Nop())
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if blockProfileRate > 0 {
		runtime.SetBlockProfileRate(blockProfileRate)
	}
	srv := emb.Server()
	n := &node{srv: srv, dir: dir}
	if n.conn, err = queue.ConnectInProcess(srv, "bench", zerolog.Nop()); err == nil {
		if n.nc, err = nats.Connect("", nats.InProcessServer(srv)); err == nil {
			n.q, err = n.conn.Open(ctx, cfg, queue.CreateOrUpdate)
		}
	}
	if err != nil {
		n.close()
		return nil, err
	}
	return n, nil
}

func (n *node) close() {
	if n.conn != nil {
		n.conn.Close()
	}
	if n.nc != nil {
		n.nc.Close()
	}
	n.srv.Shutdown()
	n.srv.WaitForShutdown()
	os.RemoveAll(n.dir)
}

// serve serves h on a loopback port until the returned stop is called.
func serve(h http.Handler) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// serveProto serves h on a loopback port as the binaries serve their APIs (cli.Server,
// with its timeouts), also taking HTTP/2 without TLS when h2c is set, until the returned
// stop is called.
func serveProto(h http.Handler, h2c bool) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := cli.Server(h)
	if h2c {
		srv.Protocols = new(http.Protocols)
		srv.Protocols.SetHTTP1(true)
		srv.Protocols.SetUnencryptedHTTP2(true)
	}
	go srv.Serve(ln)
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// modeName names a durability mode in the table.
func modeName(syncAlways bool) string {
	if syncAlways {
		return "fsync every write"
	}
	return "fsync every 2 min"
}

// serveIngest serves a real ingest API on n with cfg over loopback until the returned
// stop is called.
func serveIngest(n *node, cfg ingest.Config) (url string, stop func(), err error) {
	api, err := ingest.New(cfg, n.q, n.q, zerolog.Nop())
	if err != nil {
		return "", nil, err
	}
	return serve(api.Handler())
}

// httpClient keeps up to conns connections to one host open between requests.
func httpClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conns, MaxIdleConns: conns}}
}

// events is a writer of requests' events on a node's queue, started as the binaries
// start it (cli.StartEvents), with its counters in a registry of its own.
type events struct {
	w       *record.Writer
	q       *queue.Queue // read for a taken-over head's earlier attempts, as the binary does
	reg     *prometheus.Registry
	stopped sync.Once
	stop    func()
	report  string
}

// startEvents starts a writer of requests' events on n's queue.
func startEvents(n *node) *events {
	e := &events{reg: prometheus.NewRegistry(), q: n.q}
	e.w, e.stop = cli.StartEvents(n.q, "bench", e.reg, zerolog.Nop())
	return e
}

// on has a dispatcher write its requests' events with e (nil: none).
func (e *events) on(c *dispatch.Config) {
	if e != nil {
		c.Events, c.Attempts = e.w, e.q
	}
}

// accepted announces r's accepted event, as ingest does once the queue stored it: live,
// not stored (ADR 18).
func (e *events) accepted(r request.Request, rc request.Receipt) {
	if e != nil {
		now := time.Now()
		e.q.Announce(request.Event{Type: request.EventAccepted, ID: r.ID, ClientID: r.ClientID, At: now,
			Seq: rc.Seq, NotBefore: r.NotBefore, AcceptedAt: now})
	}
}

// eventsCatchUp bounds the wait, once the load stops, for the writer to write what it
// was behind.
const eventsCatchUp = 10 * time.Second

// close waits for the writer to catch up (up to eventsCatchUp), stops it, and says what
// it wrote and how far behind it was; call it once nothing records events any more,
// before the node closes. Only the first call does it.
func (e *events) close() string {
	if e == nil {
		return "events off"
	}
	e.stopped.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), eventsCatchUp)
		defer cancel()
		start := time.Now()
		behind := fmt.Sprintf("NOT caught up %s after the load", eventsCatchUp)
		if e.w.Flush(ctx) == nil {
			behind = fmt.Sprintf("caught up %s after the load", time.Since(start).Round(time.Millisecond))
		}
		e.stop()
		e.report = fmt.Sprintf("events %.0f written (%.0f atomic batches), %.0f retried, %.0f dropped; %s",
			e.counter("dispatch_events_written_total"), e.counter("dispatch_event_batches_total"), e.counter("dispatch_events_retried_total"), e.counter("dispatch_events_dropped_total"), behind)
	})
	return e.report
}

// counter is the value of the counter named name in e's registry.
func (e *events) counter(name string) float64 {
	mfs, _ := e.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name {
			var sum float64
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			return sum
		}
	}
	return 0
}

// startDispatcher runs a dispatcher (owning every partition) against n and raven; each
// tune that is not nil changes its configuration first.
func startDispatcher(ctx context.Context, n *node, ravenURL string, interval time.Duration, tune ...func(*dispatch.Config)) (*dispatch.Dispatcher, func(), error) {
	// Raven's answers kept as the binary keeps them by default.
	return startDispatcherKeeping(ctx, n, ravenURL, raven.DefaultKeepBytes, interval, tune...)
}

// startDispatcherKeeping is startDispatcher keeping keep bytes of each of raven's answers
// (RESPONSE_MAX_BYTES).
func startDispatcherKeeping(ctx context.Context, n *node, ravenURL string, keep int, interval time.Duration, tune ...func(*dispatch.Config)) (*dispatch.Dispatcher, func(), error) {
	rc, err := raven.New(raven.Config{URL: ravenURL, Timeout: 5 * time.Second, KeepBytes: keep, KeepHeaders: raven.DefaultKeepHeaders})
	if err != nil {
		return nil, nil, err
	}
	cfg := dispatch.Config{Policy: schedule.Policy{Interval: interval}, SendTimeout: 5 * time.Second, ShutdownGrace: 5 * time.Second}
	for _, t := range tune {
		if t != nil {
			t(&cfg)
		}
	}
	d, err := dispatch.New(cfg, n.q, rc, zerolog.Nop())
	if err != nil {
		return nil, nil, err
	}
	// As the binary does: the dispatcher answers ingest's lookups of requests without a
	// record (a status read of a request not attempted yet).
	stopLookups, err := n.q.ServeQueuedLookups()
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	return d, func() { cancel(); <-done; stopLookups() }, nil
}

// fastRaven answers 200 at once (with answer as a JSON body, if set) and calls arrived
// for each request, with the time it arrived and the time it was answered.
type fastRaven struct {
	arrived func(client, id string, at, answered time.Time)
	answer  []byte
}

func (f fastRaven) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	_, _ = io.Copy(io.Discard, r.Body)
	if f.answer != nil {
		w.Header().Set("Content-Type", "application/json")
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(f.answer)
	if f.arrived != nil {
		f.arrived(r.Header.Get("X-Client-Id"), r.Header.Get("Idempotency-Key"), at, time.Now())
	}
}

// samples collects durations and reports quantiles.
type samples struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *samples) add(d time.Duration) {
	s.mu.Lock()
	s.d = append(s.d, d)
	s.mu.Unlock()
}

func (s *samples) quantiles(qs ...float64) []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	sort.Slice(s.d, func(i, j int) bool { return s.d[i] < s.d[j] })
	out := make([]time.Duration, len(qs))
	if len(s.d) == 0 {
		return out
	}
	for i, q := range qs {
		k := int(q * float64(len(s.d)-1))
		out[i] = s.d[k]
	}
	return out
}

func (s *samples) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.d)
}

// heapAfterGC is the live heap once garbage is collected.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
