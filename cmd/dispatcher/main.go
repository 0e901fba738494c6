// Command dispatcher sends queued requests to raven, each client's in order, never two
// attempts of one client closer than DISPATCH_INTERVAL, removing a request only once raven
// accepted it or it was dead-lettered.
//
// With -standalone it runs the whole service in one process: an embedded JetStream server
// storing under DATA_DIR, the ingest API on INGEST_ADDR and the dispatcher, plus a demo
// raven that logs each arrival when RAVEN_URL is not set.
//
// Every setting is a flag and an environment variable; run with -h for the list.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/cmd/internal/cli"
	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/console"
	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/raven"
)

func main() {
	cli.Main("dispatcher", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr) })
}

type settings struct {
	standalone bool
	dataDir    string
	natsListen string
	natsSync   string
	demoAddr   string
	demoFail   string
	logs       *cli.Log
	nats       *cli.NATS
	queue      *queue.Config
	ingest     *cli.Ingest
	dispatch   *cli.Dispatch
	ops        *cli.Ops
	events     bool
	laneWait   time.Duration
}

func parse(args []string, getenv func(string) string, stderr io.Writer) (*settings, error) {
	s := cli.NewSettings("dispatcher", getenv, stderr)
	c := &settings{}
	s.Bool(&c.standalone, "STANDALONE", "run everything in one process on an embedded JetStream server")
	s.String(&c.dataDir, "DATA_DIR", "./data", "standalone: where the embedded JetStream server keeps its files")
	s.String(&c.natsListen, "NATS_LISTEN", "", "standalone: host:port where the embedded NATS also takes outside clients; empty for in-process only")
	s.OneOf(&c.natsSync, "NATS_SYNC", "always", "standalone: fsync every write before acknowledging (always), or every 2 minutes (interval)", "always", "interval")
	s.String(&c.demoAddr, "DEMO_RAVEN_ADDR", "127.0.0.1:8081", "standalone without RAVEN_URL: where the demo raven listens")
	cli.DemoFailSetting(s, &c.demoFail)
	c.logs = cli.LogSettings(s)
	c.nats = cli.NATSSettings(s)
	c.queue = cli.QueueSettings(s)
	c.ingest = cli.IngestSettings(s)
	c.dispatch = cli.DispatchSettings(s)
	c.ops = cli.OpsSettings(s, ":9091", true)
	cli.EventsSetting(s, &c.events)
	cli.LaneWaitSetting(s, &c.laneWait, admin.DefaultLaneWait)
	if err := s.Parse(args); err != nil {
		return nil, err
	}
	if c.dispatch.InstanceID == "" {
		c.dispatch.InstanceID = dispatch.DefaultInstanceID()
	} else if err := dispatch.ValidInstanceID(c.dispatch.InstanceID); err != nil {
		return nil, fmt.Errorf("INSTANCE_ID: %w", err)
	}
	// Standalone, a batch waits PUBLISH_TIMEOUT for its acknowledgements: the queue gives
	// up on them no sooner (and on events' as soon).
	c.queue.AckTimeout = c.ingest.PublishTimeout
	c.queue.NoEvents = !c.events
	if err := cli.CheckRetention(*c.queue, c.events); err != nil {
		return nil, err
	}
	if !c.standalone && c.dispatch.Raven.URL == "" {
		return nil, errors.New("RAVEN_URL is required (or run with -standalone for a demo raven)")
	}
	return c, nil
}

func run(ctx context.Context, args []string, getenv func(string) string, _ io.Writer, stderr io.Writer) error {
	c, err := parse(args, getenv, stderr)
	if err != nil {
		return err
	}
	log := c.logs.Logger(stderr, "dispatcher")
	if c.standalone {
		return runStandalone(ctx, c, log)
	}
	nc, err := c.nats.Connect("dispatcher", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	q, err := cli.OpenQueue(ctx, nc, *c.queue, queue.CreateOrUpdate, log)
	if err != nil {
		return err
	}
	leases, err := cli.Retry(ctx, log, "lease bucket", func(ctx context.Context) (*queue.Leases, error) {
		return q.Leases(ctx, c.dispatch.LeaseTTL)
	})
	if err != nil {
		return err
	}
	c.dispatch.Leases = leases
	reg := cli.NewRegistry()
	var events *queue.EventWriter
	if c.events {
		w, stop := cli.StartEvents(q, c.dispatch.InstanceID, reg, log)
		defer stop() // once the dispatcher has drained
		events = w
	}
	return runDispatcher(ctx, c, q, reg, events, log)
}

// runDispatcher runs the dispatcher, its answers to lane queries and the operators'
// listener (metrics, health, admin API) until ctx ends and the dispatcher has drained.
// The listener stays up while the dispatcher drains, /readyz saying it is not ready.
//
// events, if not nil, writes requests' events.
func runDispatcher(ctx context.Context, c *settings, q *queue.Queue, reg *prometheus.Registry, events *queue.EventWriter, log zerolog.Logger) error {
	c.dispatch.Raven.UserAgent = "dispatcher/" + c.dispatch.InstanceID
	rc, err := raven.New(c.dispatch.Raven)
	if err != nil {
		return fmt.Errorf("RAVEN_URL / RAVEN_TIMEOUT: %w", err)
	}
	ctl, err := cli.Retry(ctx, log, "control bucket", func(ctx context.Context) (*queue.Control, error) { return q.Control(ctx, log) })
	if err != nil {
		return err
	}
	c.dispatch.Steering = ctl
	c.dispatch.Metrics = dispatch.NewMetrics(reg)
	tp, stopTracing, err := cli.Tracing(ctx, "dispatch-dispatcher", log)
	if err != nil {
		return err
	}
	defer stopTracing() // after the dispatcher drained: its last attempts' spans go too
	c.dispatch.Tracing = tp
	if events != nil {
		c.dispatch.Events = events
	}
	partitions := prometheus.NewGauge(prometheus.GaugeOpts{Name: "dispatch_partitions",
		Help: "the queue's partitions (PARTITIONS): dispatch_partitions_owned across instances adds up to it while each has an owner"})
	partitions.Set(float64(q.Partitions()))
	reg.MustRegister(queue.NewCollector(q), q.WritesCollector(), partitions)
	d, err := dispatch.New(c.dispatch.Config, q, rc, log)
	if err != nil {
		return err
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go q.WatchWrites(watchCtx, 0, log)
	stopLanes, err := q.ServeLaneQueries(func(ctx context.Context, lq queue.LaneQuery) (any, error) {
		return d.Answer(ctx, dispatch.Ask(lq))
	})
	if err != nil {
		return err
	}
	defer stopLanes()
	adm, err := admin.New(admin.Config{Queue: q, Control: ctl, Log: log, Registerer: reg, LaneWait: c.laneWait, Interval: c.dispatch.Interval, Instance: c.dispatch.InstanceID, Tracing: tp})
	if err != nil {
		return err
	}
	con, err := console.New(console.Config{Admin: adm, Token: c.ops.Token, TLS: c.ops.TLSCert != "", Log: log})
	if err != nil {
		return err
	}
	ready := func(ctx context.Context) error {
		if err := q.Ready(ctx); err != nil {
			return err
		}
		if !d.Running() {
			return errors.New("the dispatcher is starting or stopping")
		}
		return nil
	}
	ln, err := cli.Listen(c.ops.Addr, "OPS_ADDR")
	if err != nil {
		return err
	}
	if ln, err = c.ops.Secure(ln); err != nil {
		return err
	}
	opsCtx, stopOps := context.WithCancel(context.WithoutCancel(ctx))
	opsDone := make(chan error, 1)
	go func() {
		opsDone <- cli.Serve(opsCtx, cli.OpsServer(cli.OpsHandler(reg, ready, adm.Handler(c.ops.Token), con.Handler(), log)), ln, 5*time.Second)
	}()
	log.Info().Str("raven", cli.SafeURL(c.dispatch.Raven.URL)).Stringer("interval", c.dispatch.Interval).Str("instance", c.dispatch.InstanceID).
		Str("ops", cli.URLFor(ln, "/")).Bool("admin_api", c.ops.Token != "").Str("console", cli.URLFor(ln, "/console/")).Msg("dispatching")
	err = d.Run(ctx)
	stopOps()
	return errors.Join(err, <-opsDone)
}

// runStandalone runs the embedded server, ingest, the dispatcher and, without RAVEN_URL, a
// demo raven, and stops them in that order's reverse: ingest first (no new requests), then
// the dispatcher (drains attempts in flight), then NATS.
func runStandalone(ctx context.Context, c *settings, log zerolog.Logger) error {
	// This process runs ingest, which takes Not-Before up to MAX_NOT_BEFORE.
	if w, atDefaults := cli.NotBeforeWarning(*c.queue, c.ingest.MaxNotBefore, c.events); atDefaults {
		log.Info().Msg(w)
	} else if w != "" {
		log.Warn().Msg(w)
	}
	ns, stopStore, err := startStore(ctx, c, log)
	if err != nil {
		return err
	}
	defer stopStore()
	nc, err := queue.ConnectInProcess(ns, "dispatcher-standalone", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	q, err := cli.OpenQueue(ctx, nc, *c.queue, queue.CreateOrUpdate, log)
	if err != nil {
		return err
	}
	q.UseGuard(ns.Guard)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g := &parts{cancel: cancel, errc: make(chan error, 4)}
	g.start(untilFatal(ctx, ns))
	if c.dispatch.Raven.URL == "" {
		demo, err := startDemoRaven(ctx, c, log, g)
		if err != nil {
			return err
		}
		c.dispatch.Raven.URL = demo
	}
	reg := cli.NewRegistry()
	reg.MustRegister(ns.Guard.Collector())
	var events *queue.EventWriter
	stopEvents := func() {}
	if c.events { // one writer for both parts
		events, stopEvents = cli.StartEvents(q, c.dispatch.InstanceID, reg, log)
	}
	ingestURL, err := startIngest(ctx, c, q, nc, reg, events, log, g)
	if err != nil {
		stopEvents()
		return err
	}
	dispatchDone := make(chan struct{})
	g.start(func() error { defer close(dispatchDone); return runDispatcher(ctx, c, q, reg, events, log) })

	log.Info().Str("ingest", ingestURL).Str("raven", cli.SafeURL(c.dispatch.Raven.URL)).
		Msgf("standalone ready: try  curl -i -H 'Content-Type: application/json' -d '{\"clientId\":\"alice\",\"n\":1}' %s", ingestURL)
	err = g.wait()
	<-dispatchDone
	stopEvents()
	nc.Drain(5 * time.Second)
	log.Info().Msg("standalone stopped")
	return err
}

// parts runs the parts of the standalone process; one stopping stops the rest.
type parts struct {
	cancel  context.CancelFunc
	errc    chan error
	running int
}

func (g *parts) start(f func() error) {
	g.running++
	go func() {
		err := f()
		g.cancel()
		g.errc <- err
	}()
}

// wait waits for every part to stop, and returns their errors.
func (g *parts) wait() error {
	var errs []error
	for range g.running {
		if err := <-g.errc; err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// startStore starts the embedded JetStream server under DATA_DIR, with its store guard,
// which brings the store back by itself after its disk was full (restarting the server
// in place). stop stops the guard, then the server.
func startStore(ctx context.Context, c *settings, log zerolog.Logger) (ns *queue.Node, stop func(), err error) {
	storeDir := filepath.Join(c.dataDir, "jetstream")
	if err := os.MkdirAll(storeDir, 0o750); err != nil {
		return nil, nil, fmt.Errorf("DATA_DIR=%q: %w", c.dataDir, err)
	}
	ns, err = queue.StartEmbedded(queue.EmbeddedConfig{StoreDir: storeDir, Listen: c.natsListen, SyncAlways: c.natsSync == "always"}, log)
	if err != nil {
		return nil, nil, err
	}
	guardCtx, stopGuard := context.WithCancel(context.WithoutCancel(ctx))
	guardDone := make(chan struct{})
	go func() { defer close(guardDone); ns.Guard.Run(guardCtx, 0) }()
	if c.nats.User != "" || c.nats.CredsFile != "" || c.nats.NKeySeedFile != "" || c.nats.CAFile != "" || c.nats.CertFile != "" {
		log.Warn().Msg("standalone uses its embedded NATS in process: the NATS_USER / NATS_*_FILE / NATS_TLS_* settings are ignored, and NATS_LISTEN (if set) takes clients without authentication")
	}
	ev := log.Info().Str("data_dir", c.dataDir).Str("sync", c.natsSync)
	if c.natsListen != "" {
		ev = ev.Str("nats_url", ns.ClientURL())
	}
	ev.Msg("embedded JetStream started")
	return ns, func() { stopGuard(); <-guardDone; ns.Shutdown() }, nil
}

// untilFatal is a part that ends with the guard's error when it cannot start the
// embedded server again: the process then exits (status 2), for a supervisor to start it
// anew.
func untilFatal(ctx context.Context, ns *queue.Node) func() error {
	fatal := make(chan error, 1)
	ns.Guard.OnFatal = func(err error) {
		select {
		case fatal <- err:
		default:
		}
	}
	return func() error {
		select {
		case err := <-fatal:
			return err
		case <-ctx.Done():
			return nil
		}
	}
}

// startIngest starts the ingest API on INGEST_ADDR and returns its URL.
func startIngest(ctx context.Context, c *settings, q *queue.Queue, nc *queue.Conn, reg *prometheus.Registry, events *queue.EventWriter, log zerolog.Logger, g *parts) (string, error) {
	c.ingest.MaxBodyBytes = cli.FitBody(c.ingest.MaxBodyBytes, nc, log)
	if events != nil {
		c.ingest.Events, c.ingest.Status, c.ingest.Instance = events, q, c.dispatch.InstanceID
	}
	c.ingest.BacklogRetryAfter = c.dispatch.Interval
	c.ingest.Metrics = ingest.NewMetrics(reg)
	tp, stopTracing, err := cli.Tracing(ctx, "dispatch-ingest", log)
	if err != nil {
		return "", err
	}
	c.ingest.Tracing = tp
	ln, err := cli.Listen(c.ingest.Addr, "INGEST_ADDR")
	if err != nil {
		stopTracing()
		return "", err
	}
	if ln, err = c.ingest.Secure(ctx, ln, log); err != nil {
		stopTracing()
		return "", err
	}
	api, err := ingest.New(c.ingest.Config, q, q, log)
	if err != nil {
		stopTracing()
		return "", err
	}
	g.start(func() error {
		defer stopTracing() // once ingest has drained
		return cli.Serve(ctx, cli.Server(api.Handler()), ln, 10*time.Second)
	})
	return cli.URLFor(ln, "/v1/requests"), nil
}

func startDemoRaven(ctx context.Context, c *settings, log zerolog.Logger, g *parts) (string, error) {
	fail, err := cli.ParseFailRules(c.demoFail)
	if err != nil {
		return "", fmt.Errorf("DEMO_RAVEN_FAIL: %w", err)
	}
	ln, err := cli.Listen(c.demoAddr, "DEMO_RAVEN_ADDR")
	if err != nil {
		return "", err
	}
	url := cli.URLFor(ln, "/")
	log.Info().Str("component", "demo-raven").Str("url", url).Msg("demo raven listening; set RAVEN_URL to send to a real one")
	g.start(func() error { return cli.Serve(ctx, cli.Server(cli.DemoRaven(log, false, fail)), ln, 5*time.Second) })
	return url, nil
}
