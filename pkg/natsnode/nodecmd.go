package natsnode

import (
	"flag"
	"fmt"
	"os"
	"slices"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"
)

// StartNodeFromArgs starts a node configured as the nats-server command configures one:
// from its flags and configuration file (args, without the program name), logging
// through nats-server's own logger. Like nats-server it prints and exits for -v,
// --help_tls and -t (check the configuration), and it blanks the passwords in os.Args.
// The node handles no signals itself: the caller stops it (Shutdown) and reloads its
// configuration (Reload). usage prints the command's usage for -h.
func StartNodeFromArgs(name string, args []string, usage func(), log zerolog.Logger) (*Node, error) {
	// A copy: RedactArgs below blanks the passwords in os.Args in place, and every
	// restart parses the arguments again.
	args = slices.Clone(args)
	options := func() (*server.Options, error) {
		fs := flag.NewFlagSet(name, flag.ExitOnError)
		fs.Usage = usage
		opts, err := server.ConfigureOptions(fs, args, server.PrintServerAndExit, fs.Usage, server.PrintTLSHelpAndDie)
		if err != nil {
			return nil, err
		}
		opts.NoSigs = true // handled by the caller: a restart must not take the process down
		return opts, nil
	}
	opts, err := options()
	if err != nil {
		return nil, err
	}
	if opts.CheckConfig {
		fmt.Fprintf(os.Stderr, "%s: configuration file %s is valid (%s)\n", name, opts.ConfigFile, opts.ConfigDigest())
		os.Exit(0)
	}
	server.RedactArgs(os.Args)
	return StartNode(options, (*server.Server).ConfigureLogger, log)
}

// Reload reads the configuration file again, as nats-server does on SIGHUP.
func (n *Node) Reload() error { return n.Server().Reload() }

// JetStream says whether the node is configured to run JetStream (and so whether its
// Guard has a store to watch): true also while JetStream is down after a store failure,
// which is what the Guard repairs.
func (n *Node) JetStream() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.opts.JetStream
}
