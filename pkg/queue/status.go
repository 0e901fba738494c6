package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// LeaseStatus is who holds which partitions now, read from the lease bucket.
type LeaseStatus struct {
	// TTL is the lease bucket's: a lease not renewed for this long expires.
	TTL time.Duration `json:"ttlNs"`
	// Partitions is the request stream's partition count.
	Partitions int `json:"partitions"`
	// Instances are the dispatchers alive now (their heartbeat has not expired), and any
	// other owner named by a lease, by id.
	Instances []InstanceStatus `json:"instances"`
	// Unowned are the partitions no lease names: nothing is sent for their clients until
	// a dispatcher takes them.
	Unowned []int `json:"unowned"`
}

// InstanceStatus is one dispatcher instance as the lease bucket shows it.
type InstanceStatus struct {
	ID string `json:"id"`
	// Heartbeat is its last heartbeat; zero when it has none (it left, or its heartbeat
	// expired while a lease naming it has not yet).
	Heartbeat time.Time        `json:"heartbeat,omitzero"`
	Leases    []PartitionLease `json:"leases"`
}

// PartitionLease is one partition's lease.
type PartitionLease struct {
	Partition int `json:"partition"`
	// Since is when the owner acquired it.
	Since time.Time `json:"since,omitzero"`
	// Renewed is when it was last written; it expires a TTL after.
	Renewed time.Time `json:"renewed"`
}

// NotRenewed are the instance's partitions whose lease was last renewed more than half
// ttl before now. Renewals come every (TTL - margin)/3, under a third of the TTL: a lease
// this late missed rounds, and its holder stops sending there TTL - margin after its
// last renewal, sooner than the store lets the lease expire. Its clients wait.
func (in InstanceStatus) NotRenewed(ttl time.Duration, now time.Time) []int {
	var late []int
	for _, le := range in.Leases {
		if ttl > 0 && !le.Renewed.IsZero() && now.Sub(le.Renewed) > ttl/2 {
			late = append(late, le.Partition)
		}
	}
	return late
}

// ErrNoLeases says no dispatcher has used leases on this queue: none ran yet, or only a
// standalone one, which owns every partition of its own server without leases.
var ErrNoLeases = errors.New("the lease bucket does not exist: no dispatcher has run with leases here (a standalone dispatcher owns every partition without them)")

// LeaseStatus reads the lease bucket, without creating or changing it.
func (q *Queue) LeaseStatus(ctx context.Context) (LeaseStatus, error) {
	kv, err := q.js.KeyValue(ctx, LeaseBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return LeaseStatus{}, ErrNoLeases
	}
	if err != nil {
		return LeaseStatus{}, fmt.Errorf("lease bucket: %w", err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return LeaseStatus{}, fmt.Errorf("lease bucket: %w", err)
	}
	out := LeaseStatus{TTL: st.TTL(), Partitions: q.cfg.Partitions}
	keys, err := listKeys(ctx, kv, ">")
	if err != nil {
		return out, fmt.Errorf("listing leases: %w", err)
	}
	byID := map[string]*InstanceStatus{}
	instance := func(id string) *InstanceStatus {
		if byID[id] == nil {
			byID[id] = &InstanceStatus{ID: id, Leases: []PartitionLease{}}
		}
		return byID[id]
	}
	owned := map[int]bool{}
	entries, err := getAll(ctx, kv, keys)
	if err != nil {
		return out, err
	}
	for _, e := range entries {
		k := e.Key()
		if id, ok := strings.CutPrefix(k, memberKeyPrefix); ok {
			instance(id).Heartbeat = e.Created()
			continue
		}
		p, err := strconv.Atoi(strings.TrimPrefix(k, leaseKeyPrefix))
		if err != nil {
			continue // not written by this service
		}
		l := leaseOf(e.Value())
		owned[p] = true
		in := instance(l.Owner)
		in.Leases = append(in.Leases, PartitionLease{Partition: p, Since: l.Since, Renewed: e.Created()})
	}
	for _, in := range byID {
		slices.SortFunc(in.Leases, func(a, b PartitionLease) int { return a.Partition - b.Partition })
		out.Instances = append(out.Instances, *in)
	}
	slices.SortFunc(out.Instances, func(a, b InstanceStatus) int { return strings.Compare(a.ID, b.ID) })
	out.Unowned = []int{}
	for p := range out.Partitions {
		if !owned[p] {
			out.Unowned = append(out.Unowned, p)
		}
	}
	return out, nil
}

// ClusterStatus is the health of the NATS servers as this connection's account sees it.
type ClusterStatus struct {
	// Connected is the server this connection is on.
	Connected string `json:"connected"`
	// Servers are the servers that answered a ping, by name.
	Servers []string `json:"servers"`
	// Meta is the JetStream meta group; nil when the account cannot see it (see
	// MetaNote).
	Meta     *GroupStatus `json:"meta,omitempty"`
	MetaNote string       `json:"metaNote,omitempty"`
	// Streams are the service's streams and buckets, each with its group.
	Streams []StreamStatus `json:"streams"`
}

// GroupStatus is a replicated group: its leader and the other replicas.
type GroupStatus struct {
	Leader   string          `json:"leader"`
	Replicas []ReplicaStatus `json:"replicas"`
}

// ReplicaStatus is one follower of a group.
type ReplicaStatus struct {
	Name    string `json:"name"`
	Current bool   `json:"current"`
	Offline bool   `json:"offline,omitempty"`
	// Lag is how many operations it is behind the leader.
	Lag uint64 `json:"lag"`
	// Active is how long ago the leader last heard from it.
	Active time.Duration `json:"activeNs"`
}

// StreamStatus is one stream's size and placement.
type StreamStatus struct {
	Name     string `json:"name"`
	Messages uint64 `json:"messages"`
	Replicas int    `json:"replicas"`
	// Group is nil on a single server, which holds the stream alone.
	Group *GroupStatus `json:"group,omitempty"`
	Error string       `json:"error,omitempty"`
}

// MetaSubject is where the service's account reaches the meta leader's JetStream report:
// deployments/nats/nats.conf imports the system account's $SYS.REQ.SERVER.PING.JSZ
// there. Without that import the meta group is not visible to the account.
const MetaSubject = "dispatch.sys.jsz"

// ClusterStatus reads the servers' and streams' health, each part within wait. What one
// part cannot read is said in it; the error is for the connection failing altogether.
func (q *Queue) ClusterStatus(ctx context.Context, wait time.Duration) (ClusterStatus, error) {
	out := ClusterStatus{Connected: q.nc.ConnectedServerName(), Servers: q.pingServers(ctx, 500*time.Millisecond)}
	out.Meta, out.MetaNote = q.metaGroup(ctx)
	for _, name := range []string{RequestStream, DeadLetterStream, EventStream, "KV_" + LeaseBucket, "KV_" + ControlBucket} {
		ss := StreamStatus{Name: name}
		sctx, cancel := context.WithTimeout(ctx, wait)
		s, err := q.js.Stream(sctx, name)
		var info *jetstream.StreamInfo
		if err == nil {
			info, err = s.Info(sctx)
		}
		cancel()
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			ss.Error = "does not exist (yet)"
		} else if err != nil {
			ss.Error = err.Error()
		}
		if err != nil {
			out.Streams = append(out.Streams, ss)
			continue
		}
		ss.Messages, ss.Replicas = info.State.Msgs, info.Config.Replicas
		if c := info.Cluster; c != nil && (c.Leader != "" || len(c.Replicas) > 0) {
			g := &GroupStatus{Leader: c.Leader, Replicas: []ReplicaStatus{}}
			for _, r := range c.Replicas {
				g.Replicas = append(g.Replicas, ReplicaStatus{Name: r.Name, Current: r.Current, Offline: r.Offline, Lag: r.Lag, Active: r.Active})
			}
			ss.Group = g
		}
		out.Streams = append(out.Streams, ss)
	}
	if err := q.nc.LastError(); err != nil && !q.nc.IsConnected() {
		return out, err
	}
	return out, nil
}

// pingServers asks every server for this account's statistics and names those that
// answer within wait.
func (q *Queue) pingServers(ctx context.Context, wait time.Duration) []string {
	names := []string{}
	inbox := q.nc.NewRespInbox()
	sub, err := q.nc.SubscribeSync(inbox)
	if err != nil {
		return names
	}
	defer sub.Unsubscribe()
	if err := q.nc.PublishRequest("$SYS.REQ.ACCOUNT.PING.STATZ", inbox, []byte(`{"include_unused":true}`)); err != nil {
		return names
	}
	deadline := time.Now().Add(wait)
	for ctx.Err() == nil {
		m, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			break
		}
		var r struct {
			Server struct{ Name string } `json:"server"`
		}
		if json.Unmarshal(m.Data, &r) == nil && r.Server.Name != "" && !slices.Contains(names, r.Server.Name) {
			names = append(names, r.Server.Name)
		}
	}
	slices.Sort(names)
	return names
}

// metaGroup asks the meta leader for its view of the meta group, where the account may.
func (q *Queue) metaGroup(ctx context.Context) (*GroupStatus, string) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	m, err := q.nc.RequestWithContext(ctx, MetaSubject, []byte(`{"leader_only":true}`))
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, "not visible to this account: it needs the system account's JSZ imported as " + MetaSubject + " (deployments/nats/nats.conf does it)"
	}
	if err != nil {
		return nil, "the meta leader did not answer: " + err.Error()
	}
	var r struct {
		Data struct {
			Meta *struct {
				Leader   string `json:"leader"`
				Replicas []struct {
					Name    string        `json:"name"`
					Current bool          `json:"current"`
					Offline bool          `json:"offline"`
					Lag     uint64        `json:"lag"`
					Active  time.Duration `json:"active"`
				} `json:"replicas"`
			} `json:"meta_cluster"`
		} `json:"data"`
	}
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return nil, "the meta leader's answer cannot be read: " + err.Error()
	}
	if r.Data.Meta == nil {
		return nil, "a single server: no meta group"
	}
	g := &GroupStatus{Leader: r.Data.Meta.Leader, Replicas: []ReplicaStatus{}}
	for _, rp := range r.Data.Meta.Replicas {
		g.Replicas = append(g.Replicas, ReplicaStatus{Name: rp.Name, Current: rp.Current, Offline: rp.Offline, Lag: rp.Lag, Active: rp.Active})
	}
	return g, ""
}
