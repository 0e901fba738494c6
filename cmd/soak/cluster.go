package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/penguinhq/dispatcher/pkg/fault"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/rs/zerolog"
)

// node is one NATS node: a natsnode process, its store and its monitoring address.
type node struct {
	name, client, monitor, store, conf string
	tmpfs                              bool // store is a small file system of its own
	p                                  *proc
}

// cluster is three natsnode processes whose routes run through fault proxies.
type cluster struct {
	dir    string
	bin    string
	nodes  []*node
	routes [][]*fault.Proxy // routes[i][j]: node i's connection to node j
	conn   *queue.Conn      // the soak's own view, straight to the nodes
}

// startCluster starts the nodes. It returns the cluster even when it fails part way, for
// close to undo what was done.
func startCluster(dir, bin string, tmpfsSize int) (*cluster, error) {
	const n = 3
	c := &cluster{dir: dir, bin: bin, routes: make([][]*fault.Proxy, n)}
	routePorts := make([]string, n)
	for i := range n {
		nd := &node{name: fmt.Sprintf("n%d", i+1), store: filepath.Join(dir, fmt.Sprintf("n%d-store", i+1))}
		var err error
		if nd.client, err = freeAddr(); err != nil {
			return c, err
		}
		if nd.monitor, err = freeAddr(); err != nil {
			return c, err
		}
		if routePorts[i], err = freeAddr(); err != nil {
			return c, err
		}
		if err := os.MkdirAll(nd.store, 0o755); err != nil {
			return c, err
		}
		if tmpfsSize > 0 {
			if err := fault.MountTmpfs(nd.store, tmpfsSize); err != nil {
				return c, fmt.Errorf("mounting a tmpfs for %s: %w", nd.name, err)
			}
			nd.tmpfs = true
		}
		c.nodes = append(c.nodes, nd)
	}
	for i := range n {
		c.routes[i] = make([]*fault.Proxy, n)
		for j := range n {
			if i == j {
				continue
			}
			p, err := fault.New(routePorts[j])
			if err != nil {
				return c, err
			}
			c.routes[i][j] = p
		}
	}
	for i, nd := range c.nodes {
		var routes []string
		for j := range n {
			if j != i {
				routes = append(routes, "nats-route://"+c.routes[i][j].Addr())
			}
		}
		nd.conf = filepath.Join(dir, nd.name+".conf")
		conf := fmt.Sprintf(`server_name: %s
listen: %s
http: %s
jetstream { store_dir: %q }
cluster {
  name: soak
  listen: %s
  no_advertise: true
  routes: [ %s ]
}
`, nd.name, nd.client, nd.monitor, nd.store, routePorts[i], strings.Join(routes, ", "))
		if err := os.WriteFile(nd.conf, []byte(conf), 0o644); err != nil {
			return c, err
		}
		if err := c.start(i); err != nil {
			return c, err
		}
	}
	var err error
	c.conn, err = queue.Connect(c.url(), "soak", zerolog.Nop(), queue.Security{})
	return c, err
}

func (c *cluster) start(i int) error {
	p, err := startProc(c.dir, c.nodes[i].name, c.bin, nil, "-c", c.nodes[i].conf)
	if err != nil {
		return err
	}
	c.nodes[i].p = p
	return nil
}

// url lists the nodes' client addresses, straight (not through a service's proxies).
func (c *cluster) url() string {
	var urls []string
	for _, nd := range c.nodes {
		urls = append(urls, "nats://"+nd.client)
	}
	return strings.Join(urls, ",")
}

// openQueue waits for the cluster to place R3 streams and returns the queue's view.
func (c *cluster) openQueue(ctx context.Context, cfg queue.Config) (*queue.Queue, error) {
	for {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		q, err := c.conn.Open(octx, cfg, queue.CreateOrUpdate)
		cancel()
		if err == nil {
			return q, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the cluster did not take the streams: %w", err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// healthy says whether every node's JetStream is up and the request stream has a
// leader and two current followers.
func (c *cluster) healthy(q *queue.Queue) bool {
	for _, nd := range c.nodes {
		if nd.p.Exited() || httpStatus("http://"+nd.monitor+"/healthz?js-enabled-only=true") != 200 {
			return false
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	p, err := q.RequestPlacement(ctx)
	return err == nil && p.Current == 3
}

// leader returns the index of the node leading the request stream, or -1.
func (c *cluster) leader(q *queue.Queue) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	p, err := q.RequestPlacement(ctx)
	if err != nil {
		return -1
	}
	for i, nd := range c.nodes {
		if nd.name == p.Leader {
			return i
		}
	}
	return -1
}

// partition cuts node i off from the others (bytes stop both ways), or heals it.
func (c *cluster) partition(i int, cut bool) {
	for j := range c.nodes {
		if j == i {
			continue
		}
		for _, p := range []*fault.Proxy{c.routes[i][j], c.routes[j][i]} {
			if cut {
				p.Blackhole()
			} else {
				p.Heal()
			}
		}
	}
}

// fill fills node i's store file system and returns a function that frees it.
func (c *cluster) fill(i int) (free func() error, err error) {
	return fault.FillDisk(c.nodes[i].store)
}

// expireLeases removes every lease and heartbeat from the lease bucket's stream as an
// expiry would (no marker, no watch event): what a forward jump of the store's clock does.
func (c *cluster) expireLeases() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return queuetest.ExpireLeasesAt(ctx, c.url())
}

func (c *cluster) close() {
	if c.conn != nil {
		c.conn.Close()
	}
	for _, nd := range c.nodes {
		if nd.p != nil {
			nd.p.Stop(syscall.SIGTERM, 15*time.Second)
		}
		if nd.tmpfs {
			_ = fault.Unmount(nd.store)
		}
	}
	for _, row := range c.routes {
		for _, p := range row {
			if p != nil {
				p.Close()
			}
		}
	}
}
