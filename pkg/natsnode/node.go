package natsnode

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

	restart sync.Mutex // one restart at a time

	mu         sync.Mutex
	srv        *server.Server
	released   chan struct{} // closed once srv has stopped (and, unless restarting, let lock go)
	lock       *storeLock    // the store directory: the node's while a server of it runs or restarts
	restarting bool          // srv is shut down and its successor not up yet
	opts       *server.Options
	port       int // the client port the first server got, kept across restarts
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
		n.letGo()
		return nil, err
	}
	n.Guard = newGuard(n, n.opts.StoreDir, log)
	return n, nil
}

// start starts a server on fresh options and makes it the node's. It does not hold
// n.mu while the server starts (that can take a while): clients asking for a connection
// meanwhile are told to come back.
func (n *Node) start() error {
	opts, err := n.options()
	if err != nil {
		return err
	}
	// The store directory is the node's from its first start until its server stops
	// other than for a restart in place (Shutdown, or a test shutting the server down
	// itself): a restart keeps it, so that no other process can take it in between.
	n.mu.Lock()
	held := n.lock != nil
	n.mu.Unlock()
	if !held && opts.StoreDir != "" {
		lock, err := lockStore(opts.StoreDir)
		if err != nil {
			return fmt.Errorf("nats server: %w", err)
		}
		n.mu.Lock()
		n.lock = lock
		n.mu.Unlock()
	}
	n.mu.Lock()
	if n.port != 0 && opts.Port <= 0 && !opts.DontListen {
		opts.Port = n.port // a restart listens where clients knew the server
	}
	if opts.JetStreamMaxStore <= 0 && n.maxStore > 0 {
		opts.JetStreamMaxStore = n.maxStore
	}
	if opts.JetStreamMaxMemory <= 0 && n.maxMemory > 0 {
		opts.JetStreamMaxMemory = n.maxMemory
	}
	n.mu.Unlock()
	s, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("nats server: %w", err)
	}
	if n.prepare != nil {
		n.prepare(s)
	}
	go s.Start()
	if !s.ReadyForConnections(nodeReadyWait) {
		s.Shutdown() // the lock stays the node's: StartNode or Shutdown lets it go
		return fmt.Errorf("nats server: not ready within %s (store dir %s)", nodeReadyWait, opts.StoreDir)
	}
	released := make(chan struct{})
	go func() {
		s.WaitForShutdown()
		n.mu.Lock()
		restarting := n.restarting && n.srv == s
		n.mu.Unlock()
		if !restarting {
			n.letGo()
		}
		close(released)
	}()
	n.mu.Lock()
	defer n.mu.Unlock()
	n.srv, n.opts, n.restarting, n.released = s, opts, false, released
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
// When the start fails, the node has no server running: Restart may be called again.
func (n *Node) Restart() error {
	n.restart.Lock()
	defer n.restart.Unlock()
	n.mu.Lock()
	old, released := n.srv, n.released
	n.restarting = true
	n.mu.Unlock()
	old.Shutdown()
	old.WaitForShutdown()
	<-released
	return n.start()
}

// Shutdown stops the server and waits until it has stopped.
func (n *Node) Shutdown() {
	n.restart.Lock()
	defer n.restart.Unlock()
	n.mu.Lock()
	s, released := n.srv, n.released
	n.mu.Unlock()
	s.Shutdown()
	s.WaitForShutdown()
	<-released
	n.letGo() // held still after a restart that failed
}

// letGo lets the store directory go, if the node holds it.
func (n *Node) letGo() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.lock.release()
	n.lock = nil
}

// ClientURL is where clients outside the process connect.
func (n *Node) ClientURL() string { return n.Server().ClientURL() }

// InProcessConn connects to the server running now, without a socket: a Node is the
// nats.InProcessConnProvider of the connections made by ConnectInProcess.
func (n *Node) InProcessConn() (net.Conn, error) {
	n.mu.Lock()
	s, restarting := n.srv, n.restarting
	n.mu.Unlock()
	if restarting || !s.Running() {
		return nil, errors.New("the embedded nats server is restarting")
	}
	return s.InProcessConn()
}

// nodeReadyWait bounds a node's start: a server recovering a large store from a slow disk,
// or one starting on a machine busy with other work, takes tens of seconds (a cluster
// node was seen past 30 s on a loaded 2-core machine); a start that never ends still
// fails, saying so.
const nodeReadyWait = 2 * time.Minute
