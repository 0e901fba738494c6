package queuetest

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Cluster is an in-process JetStream cluster on loopback. nats-server's own cluster helpers
// live in its _test.go files and cannot be imported; this is the project's own.
type Cluster struct {
	t       testing.TB
	opts    []*server.Options
	Servers []*server.Server // nil while a node is stopped
}

// NewCluster starts n JetStream nodes routed to each other and waits for a meta leader.
// Every node stops when the test ends.
func NewCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	clientPorts, routePorts := freePorts(t, n), freePorts(t, n)
	var routes []string
	for _, p := range routePorts {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	base := t.TempDir()
	c := &Cluster{t: t, Servers: make([]*server.Server, n)}
	for i := range n {
		c.opts = append(c.opts, &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       clientPorts[i],
			JetStream:  true,
			StoreDir:   filepath.Join(base, fmt.Sprintf("n%d", i+1)),
			NoLog:      true,
			NoSigs:     true,
			Cluster: server.ClusterOpts{
				Name: "dispatch-test",
				Host: "127.0.0.1",
				Port: routePorts[i],
			},
			Routes: server.RoutesFromStr(strings.Join(routes, ",")),
		})
	}
	for i := range n {
		c.Start(i)
	}
	t.Cleanup(func() {
		for i := range c.Servers {
			c.Stop(i)
		}
	})
	c.WaitForMetaLeader()
	return c
}

func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return ports
}

// Start starts node i (again), on its own port and files.
func (c *Cluster) Start(i int) {
	c.t.Helper()
	if c.Servers[i] != nil {
		return
	}
	o := *c.opts[i]
	s, err := server.NewServer(&o)
	if err != nil {
		c.t.Fatalf("node %d: %v", i, err)
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		c.t.Fatalf("node %d not ready", i)
	}
	c.Servers[i] = s
}

// Stop shuts node i down, as a crash of that node would look to the others.
func (c *Cluster) Stop(i int) {
	if s := c.Servers[i]; s != nil {
		s.Shutdown()
		s.WaitForShutdown()
		c.Servers[i] = nil
	}
}

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
	for _, s := range c.Servers {
		if s != nil {
			running++
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, s := range c.Servers {
			if s != nil && s.JetStreamIsLeader() && len(s.JetStreamClusterPeers()) >= running {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatal("no JetStream meta leader seeing every running node within 30s")
}

// StreamLeader returns the index of the node leading stream, or -1.
func (c *Cluster) StreamLeader(stream string) int {
	for i, s := range c.Servers {
		if s != nil && s.JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
			return i
		}
	}
	return -1
}
