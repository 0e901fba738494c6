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
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/cmd/internal/cli"
	"github.com/penguinhq/dispatcher/pkg/natsnode"
)

const exe = "natsnode"

func main() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	log := zerolog.New(os.Stderr).With().Timestamp().Str("service", exe).Logger()
	cli.RouteStdLog(log)
	node, err := natsnode.StartNodeFromArgs(exe, os.Args[1:], usage, log)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %s\n", exe, err)
		os.Exit(1)
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
		if node.JetStream() {
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
			if err := node.Reload(); err != nil {
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
