// Command natsnode is nats-server, configured as the nats-server command configures it
// (the same flags and configuration file), with the project's store guard beside it.
// When the node's JetStream store could not write (its disk was full), nats-server shuts
// JetStream down on a cluster node, or keeps failing a single server's streams, until it
// is restarted; the guard restarts the server in place as soon as the disk takes writes
// again, and the node rejoins its cluster by itself. The compose stack's NATS nodes run
// it.
//
// Signals: SIGINT and SIGTERM stop it, SIGHUP reloads the configuration file.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/queue"
)

const exe = "natsnode"

func main() {
	// A copy: RedactArgs below blanks the passwords in os.Args in place, and every
	// restart parses the arguments again.
	args := slices.Clone(os.Args[1:])
	options := func() (*server.Options, error) {
		fs := flag.NewFlagSet(exe, flag.ExitOnError)
		fs.Usage = usage
		opts, err := server.ConfigureOptions(fs, args, server.PrintServerAndExit, fs.Usage, server.PrintTLSHelpAndDie)
		if err != nil {
			return nil, err
		}
		opts.NoSigs = true // handled here: a restart must not take the process down
		return opts, nil
	}
	opts, err := options()
	if err != nil {
		server.PrintAndDie(fmt.Sprintf("%s: %s", exe, err))
	} else if opts.CheckConfig {
		fmt.Fprintf(os.Stderr, "%s: configuration file %s is valid (%s)\n", exe, opts.ConfigFile, opts.ConfigDigest())
		os.Exit(0)
	}
	server.RedactArgs(os.Args)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	log := zerolog.New(os.Stderr).With().Timestamp().Str("service", exe).Logger()
	node, err := queue.StartNode(options, (*server.Server).ConfigureLogger, log)
	if err != nil {
		server.PrintAndDie(fmt.Sprintf("%s: %s", exe, err))
	}
	// A server that cannot be started again ends the process, for the supervisor
	// (compose's restart policy, Kubernetes) to start it anew.
	fatal := make(chan error, 1)
	node.Guard.OnFatal = func(err error) {
		select {
		case fatal <- err:
		default:
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	guardDone := make(chan struct{})
	go func() {
		defer close(guardDone)
		if opts.JetStream {
			node.Guard.Run(ctx, 0)
		}
	}()
	code := 0
loop:
	for {
		select {
		case sig := <-sigs:
			if sig != syscall.SIGHUP {
				break loop
			}
			if err := node.Server().Reload(); err != nil {
				log.Error().Err(err).Msg("reloading the configuration failed")
			}
		case err := <-fatal:
			log.Error().Err(err).Msg("the NATS server could not be started again; exiting for the supervisor to restart the process")
			code = 1
			break loop
		}
	}
	stop()
	<-guardDone
	node.Shutdown()
	os.Exit(code)
}

func usage() {
	fmt.Fprintf(os.Stderr, "Usage: %s [nats-server options]\n\nnats-server with a store guard; every nats-server option works (nats-server -h lists them).\n", exe)
}
