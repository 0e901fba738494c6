// Command ingest is the HTTP API penguin posts requests to. It stores each accepted
// request durably in JetStream, on its client's own subject, and answers 202 only once
// JetStream acknowledged it. It keeps no state of its own; run as many as you like.
//
// Every setting is a flag and an environment variable; run with -h for the list.
package main

import (
	"context"
	"errors"
	"io"
	"os"
	"time"

	"github.com/penguinhq/dispatcher/cmd/internal/cli"
	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/queue"
)

func main() {
	cli.Main("ingest", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr) })
}

func run(ctx context.Context, args []string, getenv func(string) string, _ io.Writer, stderr io.Writer) error {
	s := cli.NewSettings("ingest", getenv, stderr)
	logs := cli.LogSettings(s)
	natsCfg := cli.NATSSettings(s, queue.RoleIngest)
	queueCfg := cli.QueueSettings(s)
	ingestCfg := cli.IngestSettings(s)
	ops := cli.OpsSettings(s, ":9090", false)
	var interval time.Duration
	var events bool
	cli.EventsSetting(s, &events)
	s.Duration(&interval, "DISPATCH_INTERVAL", 5*time.Second, time.Millisecond, "the dispatch interval; sent as Retry-After when a client's backlog is full")
	if err := s.Parse(args); err != nil {
		return err
	}
	if err := cli.CheckRetention(*queueCfg, events); err != nil {
		return err
	}
	log := logs.Logger(stderr, "ingest")
	// A batch waits PUBLISH_TIMEOUT for its acknowledgements: the queue gives up on them
	// no sooner.
	queueCfg.AckTimeout = ingestCfg.PublishTimeout
	queueCfg.NoEvents = !events
	// Ingest's NATS user may not read queued requests, nor remove any, nor create or
	// change a stream: its test writes go to its health subject (queue.RoleIngest), and it
	// waits for a dispatcher to have created the streams.
	queueCfg.NoBodyReads = true
	queueCfg.HealthRole = queue.RoleIngest

	nc, err := natsCfg.Connect("ingest", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	q, err := cli.OpenQueue(ctx, nc, *queueCfg, queue.Existing, log)
	if err != nil {
		return err
	}
	ingestCfg.MaxBodyBytes = cli.FitBody(ingestCfg.MaxBodyBytes, nc, log)
	ingestCfg.BacklogRetryAfter = interval
	reg := cli.NewRegistry()
	reg.MustRegister(q.WritesCollector())
	go q.WatchWrites(ctx, 0, log)
	ingestCfg.Metrics = ingest.NewMetrics(reg)
	ingestCfg.Backlogs = q // tokens' shares of clients with a backlog
	tp, stopTracing, err := cli.Tracing(ctx, "dispatch-ingest", log)
	if err != nil {
		return err
	}
	defer stopTracing()
	ingestCfg.Tracing = tp
	if events { // accepted events are announced live, not stored (ADR 18)
		instance, _ := os.Hostname()
		ingestCfg.Live, ingestCfg.Status, ingestCfg.Instance = q, q, "ingest/"+instance
	}
	ln, err := cli.Listen(ingestCfg.Addr, "INGEST_ADDR")
	if err != nil {
		return err
	}
	if ln, err = ingestCfg.Secure(ctx, ln, log); err != nil {
		return err
	}
	api, err := ingest.New(ingestCfg.Config, q, q, log)
	if err != nil {
		return err
	}
	opsLn, err := ops.Listen()
	if err != nil {
		return err
	}
	// The operators' listener outlives the API by its drain, so that the last requests
	// are counted in a scrape.
	stopOps := cli.ServeOps(ctx, cli.OpsHandler(reg, q.Ready, nil, nil, log), opsLn)
	log.Info().Str("url", cli.URLFor(ln, "/v1/requests")).Str("ops", cli.URLFor(opsLn, "/")).Msg("ingest listening")
	err = cli.Serve(ctx, cli.Server(api.Handler()), ln, 10*time.Second)
	err = errors.Join(err, stopOps())
	log.Info().Msg("ingest stopped")
	return err
}
