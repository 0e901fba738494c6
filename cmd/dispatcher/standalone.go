package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/cmd/internal/cli"
	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/natsnode"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/record"
)

// The standalone: an embedded NATS server, ingest, the dispatcher and a demo raven in
// one process (-standalone).

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
	// write errors (UseGuard), and tells of a server it cannot start again: its OnFatal
	// is set while it is stopped, as it reads it as it runs.
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
	var events *record.Writer
	stopEvents := func() {}
	if c.events { // the dispatcher's; ingest announces its accepted events live (ADR 18)
		events, stopEvents = cli.StartEvents(q, c.dispatch.InstanceID, reg, log)
	}
	ingestURL, err := startIngest(ctx, c, q, nc, reg, log, g)
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
		return nil, fmt.Errorf("DATA_DIR=%q: %w", c.dataDir, err)
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
			// On loopback (what the README's dispatchctl set-up asks for) it is this
			// machine's users only: said, not warned of; beyond it, a warning.
			level, who := zerolog.WarnLevel, "anyone who reaches it"
			if loopback(c.natsListen) {
				level, who = zerolog.InfoLevel, "any user of this machine"
			}
			log.WithLevel(level).Str("nats_listen", c.natsListen).Msg("the embedded NATS takes clients at NATS_LISTEN without authentication: " + who + " can read every queued body and change everything; set INGEST_NATS_PASSWORD and/or OPS_NATS_PASSWORD")
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
func startIngest(ctx context.Context, c *settings, q *queue.Queue, nc *queue.Conn, reg *prometheus.Registry, log zerolog.Logger, g *parts) (string, error) {
	c.ingest.MaxBodyBytes = cli.FitBody(c.ingest.MaxBodyBytes, nc, log)
	if c.events {
		c.ingest.Live, c.ingest.Status, c.ingest.Instance = q, q, c.dispatch.InstanceID
	}
	c.ingest.BacklogRetryAfter = c.dispatch.Interval
	c.ingest.Backlogs = q // tokens' shares of clients with a backlog
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
	g.start(func() error {
		return cli.Serve(ctx, cli.Server(cli.DemoRaven(log, false, fail, c.dispatch.Raven.Signing)), ln, 5*time.Second)
	})
	return cli.LocalURL(ln, "/"), nil
}
