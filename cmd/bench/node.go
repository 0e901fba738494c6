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
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/raven"
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
	dir, err := os.MkdirTemp("", "dispatch-bench-")
	if err != nil {
		return nil, err
	}
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{StoreDir: dir, SyncAlways: syncAlways}, zerolog.Nop())
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
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

// startDispatcher runs a dispatcher (owning every partition) against n and raven; tune,
// if given, changes its configuration first.
func startDispatcher(ctx context.Context, n *node, ravenURL string, interval time.Duration, tune ...func(*dispatch.Config)) (*dispatch.Dispatcher, func(), error) {
	rc, err := raven.New(raven.Config{URL: ravenURL, Timeout: 5 * time.Second})
	if err != nil {
		return nil, nil, err
	}
	cfg := dispatch.Config{Policy: dispatch.Policy{Interval: interval}, SendTimeout: 5 * time.Second, ShutdownGrace: 5 * time.Second}
	for _, t := range tune {
		t(&cfg)
	}
	d, err := dispatch.New(cfg, n.q, rc, zerolog.Nop())
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	return d, func() { cancel(); <-done }, nil
}

// fastRaven answers 200 at once and calls arrived for each request, with the time it
// arrived and the time it was answered.
type fastRaven struct {
	arrived func(client, id string, at, answered time.Time)
}

func (f fastRaven) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	_, _ = io.Copy(io.Discard, r.Body)
	w.WriteHeader(http.StatusOK)
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
