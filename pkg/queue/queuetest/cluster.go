package queuetest

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/fault"
	"github.com/penguinhq/dispatcher/pkg/freeport"
	"github.com/penguinhq/dispatcher/pkg/natsnode"
)

// Cluster is an in-process JetStream cluster on loopback. nats-server's own cluster helpers
// live in its _test.go files and cannot be imported; this is the project's own. Each node
// runs with a store guard, as cmd/natsnode runs a production node.
type Cluster struct {
	t      testing.TB
	opts   []*server.Options
	Nodes  []*natsnode.Node // nil while a node is stopped
	stops  []func()         // stop each running node's guard
	routes [][]*fault.Proxy // routes[i][j]: node i's connection to node j, with ProxyRoutes
}

// ClusterOptions change how NewClusterWith builds the cluster.
type ClusterOptions struct {
	// StoreDirs, if not nil, holds each node's store dir (a small file system a test can
	// fill, say); by default each node stores under a temp dir of its own.
	StoreDirs []string
	// ProxyRoutes sends the connections between nodes through fault proxies, so that a
	// test can cut a node off from the others while it keeps running (Partition).
	ProxyRoutes bool
}

// NewCluster starts n JetStream nodes routed to each other and waits for a meta leader.
// Every node stops when the test ends.
func NewCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	return NewClusterWith(t, n, ClusterOptions{})
}

// NewClusterWith is NewCluster with options.
func NewClusterWith(t testing.TB, n int, o ClusterOptions) *Cluster {
	t.Helper()
	ports := freePorts(t, 2*n) // distinct: a client port is never another node's route port
	clientPorts, routePorts := ports[:n], ports[n:]
	base := t.TempDir()
	c := &Cluster{t: t, Nodes: make([]*natsnode.Node, n), stops: make([]func(), n)}
	var sink string
	if o.ProxyRoutes {
		sink = gossipSink(t)
		c.routes = make([][]*fault.Proxy, n)
		for i := range n {
			c.routes[i] = make([]*fault.Proxy, n)
			for j := range n {
				if i == j {
					continue
				}
				p, err := fault.New(fmt.Sprintf("127.0.0.1:%d", routePorts[j]))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(p.Close)
				c.routes[i][j] = p
			}
		}
	}
	for i := range n {
		var routes []string
		for j, p := range routePorts {
			switch {
			case c.routes == nil:
				routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
			case i != j:
				routes = append(routes, "nats-route://"+c.routes[i][j].Addr())
			}
		}
		dir := filepath.Join(base, fmt.Sprintf("n%d", i+1))
		if o.StoreDirs != nil {
			dir = o.StoreDirs[i]
		}
		c.opts = append(c.opts, &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       clientPorts[i],
			JetStream:  true,
			StoreDir:   dir,
			NoLog:      true,
			NoSigs:     true,
			Cluster: server.ClusterOpts{
				Name: "dispatch-test",
				Host: "127.0.0.1",
				Port: routePorts[i],
				// With proxied routes, a node must not go round the proxies: a node that
				// hears of another through a third (gossip) before its own proxied route
				// to it is up dials the address the other advertises. Each advertises the
				// sink, which hangs up, so that every route that stays up is a proxied one.
				Advertise:   sink,
				NoAdvertise: o.ProxyRoutes,
			},
			Routes: server.RoutesFromStr(strings.Join(routes, ",")),
		})
	}
	for i := range n {
		c.Start(i)
	}
	t.Cleanup(func() {
		for i := range c.Nodes {
			c.Stop(i)
		}
	})
	c.WaitForMetaLeader()
	return c
}

// gossipSink listens on a loopback port and hangs up on every connection, until the test
// ends; it returns the address.
func gossipSink(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	return ln.Addr().String()
}

// freePorts picks n loopback ports below the ephemeral range: a node that is restarted
// binds its ports again, and one from the range could have gone to a connection meanwhile
// (package freeport).
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	for len(ports) < n {
		p, err := freeport.Port()
		if err != nil {
			t.Fatal(err)
		}
		ports = append(ports, p)
	}
	return ports
}

// Start starts node i (again), on its own port and files, with its store guard.
func (c *Cluster) Start(i int) {
	c.t.Helper()
	if c.Nodes[i] != nil {
		return
	}
	base := c.opts[i]
	n, err := natsnode.StartNode(func() (*server.Options, error) { o := *base; return &o, nil }, nil, zerolog.Nop())
	if err != nil {
		c.t.Fatalf("node %d: %v", i, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); n.Guard.Run(ctx, 100*time.Millisecond) }()
	c.Nodes[i], c.stops[i] = n, func() { cancel(); <-done }
}

// Stop shuts node i down, as a crash of that node would look to the others.
func (c *Cluster) Stop(i int) {
	if n := c.Nodes[i]; n != nil {
		c.stops[i]()
		n.Shutdown()
		c.Nodes[i] = nil
	}
}

// Server is node i's server running now; nil while the node is stopped.
func (c *Cluster) Server(i int) *server.Server {
	if c.Nodes[i] == nil {
		return nil
	}
	return c.Nodes[i].Server()
}

// Partition cuts node i off from the other nodes, both ways, while it keeps running and
// serving its clients: bytes between them stop (a blackhole, as a network partition
// drops packets) until Heal. Needs ProxyRoutes.
func (c *Cluster) Partition(i int) {
	c.eachRoute(i, (*fault.Proxy).Blackhole)
}

// Heal undoes Partition(i).
func (c *Cluster) Heal(i int) {
	c.eachRoute(i, (*fault.Proxy).Heal)
}

func (c *Cluster) eachRoute(i int, f func(*fault.Proxy)) {
	c.t.Helper()
	if c.routes == nil {
		c.t.Fatal("the cluster was not built with ProxyRoutes")
	}
	for j := range c.routes {
		if j != i {
			f(c.routes[i][j])
			f(c.routes[j][i])
		}
	}
}

// StoreDir is node i's store dir.
func (c *Cluster) StoreDir(i int) string { return c.opts[i].StoreDir }

// URL lists every node's client URL, comma-separated, as NATS_URL takes it.
func (c *Cluster) URL() string {
	var urls []string
	for _, o := range c.opts {
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", o.Port))
	}
	return strings.Join(urls, ",")
}

// WaitForMetaLeader waits until the running nodes agree on a JetStream meta leader and
// the leader sees every running node online, so that an R3 stream can be placed.
func (c *Cluster) WaitForMetaLeader() {
	c.t.Helper()
	running := 0
	for _, n := range c.Nodes {
		if n != nil {
			running++
		}
	}
	// A bound on a hang, not a verdict: an election on a machine running two CI runs
	// took more than 30 s.
	const bound = 90 * time.Second
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		for i := range c.Nodes {
			if s := c.Server(i); s != nil && s.JetStreamIsLeader() && len(s.JetStreamClusterPeers()) >= running {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatalf("no JetStream meta leader seeing every running node within %s", bound)
}

// StreamLeader returns the index of the node leading stream, or -1.
func (c *Cluster) StreamLeader(stream string) int {
	for i := range c.Nodes {
		if s := c.Server(i); s != nil && s.JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
			return i
		}
	}
	return -1
}
