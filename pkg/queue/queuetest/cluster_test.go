package queuetest

import (
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// With ProxyRoutes, every route between nodes goes through its proxy, so that Partition
// cuts a node off for real. A node that heard of another through gossip before its own
// route to it was up used to dial the other's route port directly (about one cluster in
// three), and a partitioned node then still reached the others.
func TestEveryRouteGoesThroughItsProxy(t *testing.T) {
	t.Parallel()
	for range 5 {
		c := NewClusterWith(t, 3, ClusterOptions{ProxyRoutes: true})
		direct := map[int]string{}
		for _, o := range c.opts {
			direct[o.Cluster.Port] = o.ServerName
		}
		for i := range c.Nodes {
			rz, err := c.Server(i).Routez(&server.RoutezOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(rz.Routes) == 0 {
				t.Fatalf("%s has no routes", c.opts[i].ServerName)
			}
			for _, r := range rz.Routes {
				if name, ok := direct[r.Port]; ok && r.DidSolicit {
					t.Errorf("%s dialed %s's route port directly, round its proxy", c.opts[i].ServerName, name)
				}
			}
		}
		for i := range c.Nodes {
			c.Stop(i)
		}
	}
}
