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
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/cmd/internal/cli"
	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/console"
	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/natsnode"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/raven"
	"github.com/penguinhq/dispatcher/pkg/request"
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
	reg.MustRegister(queue.NewCollector(q), q.WritesCollector(), partitions)
	d, err := dispatch.New(c.dispatch.Config, q, rc, log)
	if err != nil {
		return err
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go q.WatchWrites(watchCtx, 0, log)
	stopLanes, err := q.ServeLaneQueries(func(ctx context.Context, lq request.LaneQuery) (any, error) {
		return d.Answer(ctx, lq)
	})
	if err != nil {
		return err
	}
	defer stopLanes()
	stopLookups, err := q.ServeQueuedLookups() // for ingest's status reads of requests without a record (ADR 10)
	if err != nil {
		return err
	}
	defer stopLookups()
	stopCancels, err := admin.ServeCancels(q, d, c.dispatch.InstanceID, log) // the cancels of the clients it owns (ADR 13)
	if err != nil {
		return err
	}
	defer stopCancels()
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
	st, err := startStore(c, log)
	if err != nil {
		return err
	}
	defer st.stop()
	ns := st.ns
	nc, err := queue.ConnectInProcess(ns, "dispatcher-standalone", log, st.self)
	if err != nil {
		return err
	}
	defer nc.Close()
	q, err := cli.OpenQueue(ctx, nc, *c.queue, queue.CreateOrUpdate, log)
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g := &parts{cancel: cancel, errc: make(chan error, 4)}
	// The guard has run since the server started; now it also hears of the queue's
	// write errors, and tells of a server it cannot start again. Its fields are set
	// while it is stopped: it reads them as it runs.
	var fatal func() error
	st.configureGuard(func(guard *natsnode.StoreGuard) {
		q.UseGuard(guard)
		fatal = untilFatal(ctx, ns)
	})
	g.start(fatal)
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

	log.Info().Str("ingest", ingestURL).Str("raven", cli.SafeURL(c.dispatch.Raven.URL)).Msg(readyHint(ingestURL, c.ingest))
	err = g.wait()
	<-dispatchDone
	stopEvents()
	nc.Drain(5 * time.Second)
	log.Info().Msg("standalone stopped")
	return err
}

// readyHint is the line that says the standalone is ready, with a curl command that
// queues a request at url under the ingest settings in force: with a bearer token when
// ingest requires one, and a client certificate under mutual TLS. Secrets appear as
// shell variables to set, never as their values.
func readyHint(url string, in *cli.Ingest) string {
	cmd := []string{"curl -i -H 'Content-Type: application/json'"}
	var needs []string // what to set for cmd to run
	switch {
	case in.TokensFile == "" && in.Tokens != "" && !strings.Contains(in.Tokens, ","):
		cmd = append(cmd, `-H "Authorization: Bearer $INGEST_TOKEN"`)
		needs = append(needs, "INGEST_TOKEN set to this process's token")
	case in.TokensFile != "" || in.Tokens != "":
		cmd = append(cmd, `-H "Authorization: Bearer $TOKEN"`)
		needs = append(needs, "TOKEN set to a token INGEST_TOKEN or INGEST_TOKENS_FILE accepts")
	}
	if in.ClientCA != "" {
		cmd = append(cmd, `--cert "$CLIENT_CERT" --key "$CLIENT_KEY"`)
		needs = append(needs, "CLIENT_CERT and CLIENT_KEY set to a certificate from INGEST_TLS_CLIENT_CA and its key")
	}
	cmd = append(cmd, `-d '{"clientId":"alice","n":1}'`, url)
	hint := "standalone ready: try  " + strings.Join(cmd, " ")
	if len(needs) > 0 {
		hint += "  (with " + strings.Join(needs, "; ") + ")"
	}
	return hint
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

// loopback says whether a host:port listens on loopback only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// store is the embedded JetStream server and its store guard, which brings the store
// back by itself after its disk was full (restarting the server in place).
type store struct {
	ns        *natsnode.Node
	self      queue.Security // how this process connects to it
	stopGuard func()
}

// startStore starts the embedded JetStream server under DATA_DIR, and its guard.
func startStore(c *settings, log zerolog.Logger) (*store, error) {
	storeDir := filepath.Join(c.dataDir, "jetstream")
	if err := os.MkdirAll(storeDir, 0o750); err != nil {
		return nil, fmt.Errorf("DATA_DIR=%q: %w", c.dataDir, err)
	}
	cfg := natsnode.EmbeddedConfig{StoreDir: storeDir, Listen: c.natsListen, SyncAlways: c.natsSync == "always"}
	// The process's own connection: unauthenticated in process, unless NATS_LISTEN has
	// users; then as the dispatcher, with a password no one else knows.
	st := &store{self: queue.Security{InboxPrefix: queue.InboxPrefix(queue.RoleDispatcher)}}
	if c.natsListen != "" && c.listenUsers != nil {
		cfg.Users = maps.Clone(c.listenUsers)
		st.self.User, st.self.Password = string(queue.RoleDispatcher), rand.Text()
		cfg.Users[queue.RoleDispatcher] = st.self.Password
	}
	ns, err := natsnode.StartEmbedded(cfg, log)
	if err != nil {
		return nil, err
	}
	st.ns = ns
	st.runGuard()
	if c.nats.User != "" || c.nats.CredsFile != "" || c.nats.NKeySeedFile != "" || c.nats.CAFile != "" || c.nats.CertFile != "" {
		log.Warn().Msg("standalone uses its embedded NATS in process: the NATS_USER / NATS_*_FILE / NATS_TLS_* settings are ignored (INGEST_NATS_PASSWORD and OPS_NATS_PASSWORD give NATS_LISTEN its users)")
	}
	ev := log.Info().Str("data_dir", c.dataDir).Str("sync", c.natsSync)
	if c.natsListen != "" {
		ev = ev.Str("nats_url", ns.ClientURL())
		if c.listenUsers != nil {
			users := []string{}
			for _, r := range queue.Roles {
				if _, ok := c.listenUsers[r]; ok {
					users = append(users, string(r))
				}
			}
			ev = ev.Strs("nats_users", users)
		} else {
			log.Warn().Str("nats_listen", c.natsListen).Msg("the embedded NATS takes clients at NATS_LISTEN without authentication: anyone who reaches it can read every queued body and change everything; set INGEST_NATS_PASSWORD and/or OPS_NATS_PASSWORD")
		}
	}
	ev.Msg("embedded JetStream started")
	return st, nil
}

// runGuard runs the guard until stopGuard.
func (st *store) runGuard() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); st.ns.Guard.Run(ctx, 0) }()
	st.stopGuard = func() { cancel(); <-done }
}

// configureGuard calls set with the guard stopped, then runs it again: the guard reads
// its fields as it runs, so they are not for changing meanwhile.
func (st *store) configureGuard(set func(*natsnode.StoreGuard)) {
	st.stopGuard()
	set(st.ns.Guard)
	st.runGuard()
}

// stop stops the guard, then the server.
func (st *store) stop() {
	st.stopGuard()
	st.ns.Shutdown()
}

// untilFatal is a part that ends with the guard's error when it cannot start the
// embedded server again: the process then exits (status 2), for a supervisor to start it
// anew.
func untilFatal(ctx context.Context, ns *natsnode.Node) func() error {
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

// startIngest starts the ingest API on INGEST_ADDR and returns its URL, with the address
// it bound.
func startIngest(ctx context.Context, c *settings, q *queue.Queue, nc *queue.Conn, reg *prometheus.Registry, events *queue.EventWriter, log zerolog.Logger, g *parts) (string, error) {
	c.ingest.MaxBodyBytes = cli.FitBody(c.ingest.MaxBodyBytes, nc, log)
	if events != nil {
		c.ingest.Events, c.ingest.Status, c.ingest.Instance = events, q, c.dispatch.InstanceID
	}
	c.ingest.BacklogRetryAfter = c.dispatch.Interval
	c.ingest.Backlogs = q // scoped tokens' shares of clients with a backlog
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

// startDemoRaven starts the demo raven on DEMO_RAVEN_ADDR and returns the URL at which the
// dispatcher reaches it (loopback when it listens on every interface).
func startDemoRaven(ctx context.Context, c *settings, log zerolog.Logger, g *parts) (string, error) {
	fail, err := cli.ParseFailRules(c.demoFail)
	if err != nil {
		return "", fmt.Errorf("DEMO_RAVEN_FAIL: %w", err)
	}
	ln, err := cli.Listen(c.demoAddr, "DEMO_RAVEN_ADDR")
	if err != nil {
		return "", err
	}
	log.Info().Str("component", "demo-raven").Str("url", cli.URLFor(ln, "/")).Msg("demo raven listening; set RAVEN_URL to send to a real one")
	g.start(func() error { return cli.Serve(ctx, cli.Server(cli.DemoRaven(log, false, fail)), ln, 5*time.Second) })
	return cli.LocalURL(ln, "/"), nil
}
