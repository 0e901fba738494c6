// Command dispatcher sends queued requests to raven, each client's in order, never two
// attempts of one client closer than DISPATCH_INTERVAL, removing a request only once raven
// accepted it or it was dead-lettered.
//
// With -standalone it runs the whole service in one process: an embedded JetStream server
// storing under DATA_DIR, the ingest API on INGEST_ADDR and the dispatcher, plus a demo
// raven that logs each arrival when RAVEN_URL is not set. Standalone, its listeners bind
// loopback unless their address is set (standaloneIngestAddr, standaloneOpsAddr).
//
// Every setting is a flag and an environment variable; run with -h for the list.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/cmd/internal/cli"
	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/console"
	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/raven"
	"github.com/penguinhq/dispatcher/pkg/record"
)

func main() {
	cli.Main("dispatcher", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr) })
}

// The standalone's listeners when INGEST_ADDR or OPS_ADDR is not set: loopback only. The
// standalone is a laptop's demo and a developer's tool, with ingest open to anyone unless
// a token is set and the admin console on the operators' listener: setting the address
// (":8080") opens it to the network. Without -standalone the defaults are every
// interface (":8080", ":9091"), as a container needs.
const (
	standaloneIngestAddr = "127.0.0.1:8080"
	standaloneOpsAddr    = "127.0.0.1:9091"
)

type settings struct {
	standalone bool
	dataDir    string
	natsListen string
	// the embedded NATS's users, for clients at NATS_LISTEN: role → password
	listenUsers  map[queue.Role]string
	listenNoAuth bool
	natsSync     string
	demoAddr     string
	demoFail     string
	logs         *cli.Log
	nats         *cli.NATS
	queue        *queue.Config
	ingest       *cli.Ingest
	dispatch     *cli.Dispatch
	ops          *cli.Ops
	events       bool
	laneWait     time.Duration
}

func parse(args []string, getenv func(string) string, stderr io.Writer) (*settings, error) {
	s := cli.NewSettings("dispatcher", getenv, stderr)
	c := &settings{}
	s.Bool(&c.standalone, "STANDALONE", "run everything in one process on an embedded JetStream server")
	s.String(&c.dataDir, "DATA_DIR", "./data", "standalone: where the embedded JetStream server keeps its files")
	s.String(&c.natsListen, "NATS_LISTEN", "", "standalone: host:port where the embedded NATS also takes outside clients; empty for in-process only")
	var ingestPW, opsPW string
	s.Secret(&ingestPW, "INGEST_NATS_PASSWORD", "standalone with NATS_LISTEN: the embedded NATS takes a user ingest with this password, allowed only ingest's job (an ingest elsewhere connects as it)")
	s.Secret(&opsPW, "OPS_NATS_PASSWORD", "standalone with NATS_LISTEN: the embedded NATS takes a user ops with this password, allowed only the operators' job (dispatchctl connects as it)")
	s.Bool(&c.listenNoAuth, "NATS_LISTEN_NO_AUTH", "standalone: let NATS_LISTEN take clients without authentication on an address other than loopback (anyone who reaches it can read and change everything)")
	s.OneOf(&c.natsSync, "NATS_SYNC", "always", "standalone: fsync every write before acknowledging (always), or every 2 minutes (interval)", "always", "interval")
	s.String(&c.demoAddr, "DEMO_RAVEN_ADDR", "127.0.0.1:8081", "standalone without RAVEN_URL: where the demo raven listens")
	cli.DemoFailSetting(s, &c.demoFail)
	c.logs = cli.LogSettings(s)
	c.nats = cli.NATSSettings(s, queue.RoleDispatcher)
	c.queue = cli.QueueSettings(s)
	c.ingest = cli.IngestSettings(s)
	c.dispatch = cli.DispatchSettings(s)
	c.ops = cli.OpsSettings(s, ":9091", true)
	cli.EventsSetting(s, &c.events)
	cli.LaneWaitSetting(s, &c.laneWait, admin.DefaultLaneWait)
	if err := s.Parse(args); err != nil {
		return nil, err
	}
	if ingestPW != "" || opsPW != "" {
		c.listenUsers = map[queue.Role]string{}
		if ingestPW != "" {
			c.listenUsers[queue.RoleIngest] = ingestPW
		}
		if opsPW != "" {
			c.listenUsers[queue.RoleOps] = opsPW
		}
	}
	if c.standalone && c.natsListen != "" && c.listenUsers == nil && !c.listenNoAuth && !loopback(c.natsListen) {
		return nil, fmt.Errorf("NATS_LISTEN=%s takes clients from the network without authentication, and anyone who reaches it could read and change everything: "+
			"set INGEST_NATS_PASSWORD and/or OPS_NATS_PASSWORD (users allowed only their own jobs), listen on 127.0.0.1, or set NATS_LISTEN_NO_AUTH=true", c.natsListen)
	}
	if c.standalone && !s.Given("INGEST_ADDR") {
		c.ingest.Addr = standaloneIngestAddr
	}
	if c.standalone && !s.Given("OPS_ADDR") {
		c.ops.Addr = standaloneOpsAddr
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
	var events *record.Writer
	if c.events {
		w, stop := cli.StartEvents(q, c.dispatch.InstanceID, reg, log)
		defer stop() // once the dispatcher has drained
		events = w
	}
	return runDispatcher(ctx, c, q, reg, events, log)
}

// runDispatcher runs the dispatcher, its answers to operators' questions and the operators'
// listener (metrics, health, admin API) until ctx ends and the dispatcher has drained.
// The listener stays up while the dispatcher drains, /readyz saying it is not ready.
//
// events, if not nil, writes requests' events.
func runDispatcher(ctx context.Context, c *settings, q *queue.Queue, reg *prometheus.Registry, events *record.Writer, log zerolog.Logger) error {
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
		c.dispatch.Attempts = q // a taken-over head's attempts count on from the record
		// Final events kept in the request stream while the events stream did not take
		// them (ADR 9) go there once it does; every dispatcher drains them.
		q.ObserveOutcomes(reg, log)
		dctx, stopDrain := context.WithCancel(ctx)
		drained := make(chan struct{})
		go func() { defer close(drained); q.DrainOutcomes(dctx, 0) }()
		defer func() { stopDrain(); <-drained }()
	}
	partitions := prometheus.NewGauge(prometheus.GaugeOpts{Name: "dispatch_partitions",
		Help: "the queue's partitions (PARTITIONS): dispatch_partitions_owned across instances adds up to it while each has an owner"})
	partitions.Set(float64(q.Partitions()))
	reg.MustRegister(queue.NewCollector(q), q.WritesCollector(), q.LinkCollector(), partitions)
	d, err := dispatch.New(c.dispatch.Config, q, rc, log)
	if err != nil {
		return err
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	// A head is read only through a NATS server a write has gone through since the
	// connection moved there: one cut off from its cluster answers from an old copy.
	q.ProveHeadReads()
	go q.WatchWrites(watchCtx, 0, log)
	stopAsks, err := serveAsks(q, d, c.dispatch.InstanceID, log)
	if err != nil {
		return err
	}
	defer stopAsks()
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
	ln, err := c.ops.Listen()
	if err != nil {
		return err
	}
	stopOps := cli.ServeOps(ctx, cli.OpsHandler(reg, ready, adm.Handler(c.ops.Token), con.Handler(), log), ln)
	console := "off: set ADMIN_TOKEN to sign in at " + cli.URLFor(ln, "/console/")
	if c.ops.Token != "" {
		console = cli.URLFor(ln, "/console/")
	}
	log.Info().Str("raven", cli.SafeURL(c.dispatch.Raven.URL)).Stringer("interval", c.dispatch.Interval).Str("instance", c.dispatch.InstanceID).
		Str("ops", cli.URLFor(ln, "/")).Bool("admin_api", c.ops.Token != "").Str("console", console).Msg("dispatching")
	err = d.Run(ctx)
	return errors.Join(err, stopOps())
}

// serveAsks answers what the others ask the running dispatchers: the operators'
// questions (pkg/introspect), ingest's status reads of requests without a record (ADR 10), and the cancels
// of the clients this one owns (ADR 13).
func serveAsks(q *queue.Queue, d *dispatch.Dispatcher, instance string, log zerolog.Logger) (stop func(), err error) {
	stopQuestions, err := q.ServeQuestions(instance, introspect.AnswersOf(d), log)
	if err != nil {
		return nil, err
	}
	stopLookups, err := q.ServeQueuedLookups()
	if err != nil {
		stopQuestions()
		return nil, err
	}
	stopCancels, err := admin.ServeCancels(q, d, instance, log)
	if err != nil {
		stopLookups()
		stopQuestions()
		return nil, err
	}
	return func() { stopCancels(); stopLookups(); stopQuestions() }, nil
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
