// Command demoraven is a stand-in for raven: it accepts every request and logs each
// arrival with the gap since that client's previous one, so that the spacing can be
// watched. With RECORD_ARRIVALS it also lists every arrival at GET /arrivals, which the
// end-to-end test reads. To rehearse failures it refuses chosen clients' requests
// (DEMO_RAVEN_FAIL, or PUT /fail/{clientId} while it runs). With RAVEN_SIGNING_SECRET it
// verifies each request's signature, as a raven should. The docker-compose stack sends
// to it.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/penguinhq/dispatcher/cmd/internal/cli"
	"github.com/penguinhq/dispatcher/pkg/webhook"
)

func main() {
	cli.Main("demoraven", func(ctx context.Context) error { return run(ctx, os.Args[1:]) })
}

func run(ctx context.Context, args []string) error {
	s := cli.NewSettings("demoraven", os.Getenv, os.Stderr)
	logs := cli.LogSettings(s)
	var addr string
	var record bool
	var failRules string
	var signing []webhook.Secret
	s.String(&addr, "DEMO_RAVEN_ADDR", "127.0.0.1:8081", "where the demo raven listens (it has no authentication: loopback unless you mean otherwise)")
	s.Bool(&record, "RECORD_ARRIVALS", "keep every arrival and list them at GET /arrivals (memory grows with traffic)")
	cli.DemoFailSetting(s, &failRules)
	s.SigningSecrets(&signing, "RAVEN_SIGNING_SECRET", "verify each request's Standard Webhooks signature with this secret (several, space-separated, while one rotates) and refuse a bad or stale one with 401; unset: no check")
	if err := s.Parse(args); err != nil {
		return err
	}
	fail, err := cli.ParseFailRules(failRules)
	if err != nil {
		return fmt.Errorf("DEMO_RAVEN_FAIL: %w", err)
	}
	log := logs.Logger(os.Stderr, "demoraven")
	ln, err := cli.Listen(addr, "DEMO_RAVEN_ADDR")
	if err != nil {
		return err
	}
	log.Info().Str("url", cli.URLFor(ln, "/")).Bool("record", record).Interface("fail", fail).Bool("verify_signatures", len(signing) > 0).Msg("demo raven listening")
	return cli.Serve(ctx, cli.Server(cli.DemoRaven(log, record, fail, signing)), ln, 5*time.Second)
}
