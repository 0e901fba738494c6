package queue

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"
)

// Node is a nats-server running in this process that its StoreGuard restarts in place
// after the store could not write: the standalone binary's embedded server, each
// natsnode, each node of the test cluster.
//
// A restart is a whole new server on the same options and files, as an operator's
// restart would be: nats-server's start-up path, not its less travelled one of enabling
// JetStream again at run time. Clients reconnect by themselves (in-process ones too:
// Node is their InProcessConnProvider and hands them the new server).
type Node struct {
	options func() (*server.Options, error) // fresh options for each start
	prepare func(*server.Server)            // before Start (a logger)
	Guard   *StoreGuard

	mu   sync.Mutex
	srv  *server.Server
	opts *server.Options
	port int // the client port the first server got, kept across restarts
	// The JetStream limits the first server worked out, kept across restarts: without a
	// configured max_file_store, nats-server takes a share of the disk space free when it
	// starts, and right after a full disk that is next to nothing, for good.
	maxStore, maxMemory int64
}

// StartNode starts a server on options() and waits until it takes connections. prepare,
// if not nil, is called with each new server before it starts. Run the Guard to have it
// recover by itself from a full disk.
func StartNode(options func() (*server.Options, error), prepare func(*server.Server), log zerolog.Logger) (*Node, error) {
	n := &Node{options: options, prepare: prepare}
	if err := n.start(); err != nil {
		return nil, err
	}
	n.Guard = newGuard(n, n.opts.StoreDir, log)
	return n, nil
}

func (n *Node) start() error {
	opts, err := n.options()
	if err != nil {
		return err
	}
	if n.port != 0 && opts.Port <= 0 && !opts.DontListen {
		opts.Port = n.port // a restart listens where clients knew the server
	}
	if opts.JetStreamMaxStore <= 0 && n.maxStore > 0 {
		opts.JetStreamMaxStore = n.maxStore
	}
	if opts.JetStreamMaxMemory <= 0 && n.maxMemory > 0 {
		opts.JetStreamMaxMemory = n.maxMemory
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("nats server: %w", err)
	}
	if n.prepare != nil {
		n.prepare(s)
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		return fmt.Errorf("nats server: not ready within 30s (store dir %s)", opts.StoreDir)
	}
	n.srv, n.opts = s, opts
	if addr, ok := s.Addr().(*net.TCPAddr); ok && n.port == 0 {
		n.port = addr.Port
	}
	if js := s.JetStreamConfig(); js != nil && n.maxStore == 0 {
		n.maxStore, n.maxMemory = js.MaxStore, js.MaxMemory
	}
	return nil
}

// Server is the server running now.
func (n *Node) Server() *server.Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.srv
}

// Restart shuts the server down and starts a new one on the same options and files.
func (n *Node) Restart() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.srv.Shutdown()
	n.srv.WaitForShutdown()
	return n.start()
}

// Shutdown stops the server and waits until it has stopped.
func (n *Node) Shutdown() {
	s := n.Server()
	s.Shutdown()
	s.WaitForShutdown()
}

// ClientURL is where clients outside the process connect.
func (n *Node) ClientURL() string { return n.Server().ClientURL() }

// InProcessConn connects to the server running now, without a socket: a Node is the
// nats.InProcessConnProvider of the connections made by ConnectInProcess.
func (n *Node) InProcessConn() (net.Conn, error) {
	s := n.Server()
	if s == nil || !s.Running() {
		return nil, errors.New("the embedded nats server is restarting")
	}
	return s.InProcessConn()
}
