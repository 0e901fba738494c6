package dispatchsim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/lease"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// The conformance suites hold the simulation's fakes to the real adapters: each runs
// against this package's Store and Queue and, in pkg/queue's tests, against the lease
// bucket and request stream on an embedded NATS server. A behaviour the simulation
// relies on is asserted here, or the simulation proves nothing about the real thing.

// LeaseStoreUnderTest is a fresh, empty lease store for ConformLeaseStore.
type LeaseStoreUnderTest struct {
	Store lease.Store
	// Expire removes every lease and heartbeat at once, as a jump of the store's clock
	// past their TTL does: without a watch event.
	Expire func()
}

// ConformLeaseStore checks what the dispatcher's leaser relies on of a lease store.
func ConformLeaseStore(t *testing.T, open func(t *testing.T) LeaseStoreUnderTest) {
	for _, c := range []struct {
		name string
		run  func(t *testing.T, ctx context.Context, open func(t *testing.T) LeaseStoreUnderTest)
	}{
		{"WrittenOnceWritten", leasesWrittenOnceWritten},
		{"AcquireRenewRelease", leasesAcquireRenewRelease},
		{"ReleaseAllOfOneOwner", leasesReleaseAllOfOneOwner},
		{"MembersHeartbeatLeave", leasesMembersHeartbeatLeave},
		{"WatchInPlaceThenChanges", leasesWatchInPlaceThenChanges},
		{"ExpiryLeavesNoTrace", leasesExpiryLeavesNoTrace},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t, context.Background(), open) })
	}
}

// must fails t, saying what failed, when err is not nil.
func must(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func leasesWrittenOnceWritten(t *testing.T, ctx context.Context, open func(t *testing.T) LeaseStoreUnderTest) {
	s := open(t).Store
	w, err := s.Written(ctx)
	must(t, err, "written")
	if w {
		t.Fatal("a new store says it was written to")
	}
	must(t, s.Heartbeat(ctx, "a"), "heartbeat")
	if w, err := s.Written(ctx); err != nil || !w {
		t.Fatalf("after a heartbeat: written %v, %v; want true", w, err)
	}
}

func leasesAcquireRenewRelease(t *testing.T, ctx context.Context, open func(t *testing.T) LeaseStoreUnderTest) {
	s := open(t).Store
	rev, ok, err := s.Acquire(ctx, 3, "a")
	if err != nil || !ok {
		t.Fatalf("acquire a free partition: %v %v", ok, err)
	}
	if _, ok, err := s.Acquire(ctx, 3, "b"); ok || err != nil {
		t.Fatalf("acquire a held partition: ok %v err %v; want refused, no error", ok, err)
	}
	rev2, ok, err := s.Renew(ctx, 3, "a", rev)
	if err != nil || !ok || rev2 <= rev {
		t.Fatalf("renew: rev %d -> %d ok %v err %v; want a later revision", rev, rev2, ok, err)
	}
	if _, ok, err := s.Renew(ctx, 3, "a", rev); ok || err != nil {
		t.Fatalf("renew at a stale revision: ok %v err %v; want lost, no error", ok, err)
	}
	if err := s.Release(ctx, 3, rev); err == nil {
		t.Fatal("release at a stale revision succeeded")
	}
	must(t, s.Release(ctx, 3, rev2), "release")
	if _, ok, err := s.Renew(ctx, 3, "a", rev2); ok || err != nil {
		t.Fatalf("renew after the release: ok %v err %v; want lost", ok, err)
	}
	if _, ok, err := s.Acquire(ctx, 3, "b"); !ok || err != nil {
		t.Fatalf("acquire after the release: ok %v err %v", ok, err)
	}
}

func leasesReleaseAllOfOneOwner(t *testing.T, ctx context.Context, open func(t *testing.T) LeaseStoreUnderTest) {
	s := open(t).Store
	for p, owner := range map[int]string{1: "a", 2: "a", 5: "b"} {
		if _, ok, err := s.Acquire(ctx, p, owner); !ok || err != nil {
			t.Fatalf("acquire %d for %s: %v %v", p, owner, ok, err)
		}
	}
	n, err := s.ReleaseAll(ctx, "a")
	if err != nil || n != 2 {
		t.Fatalf("release all of a: %d, %v; want 2", n, err)
	}
	if _, ok, _ := s.Acquire(ctx, 5, "c"); ok {
		t.Fatal("b's lease went with a's")
	}
	if _, ok, _ := s.Acquire(ctx, 1, "c"); !ok {
		t.Fatal("a's lease is still held")
	}
}

func leasesMembersHeartbeatLeave(t *testing.T, ctx context.Context, open func(t *testing.T) LeaseStoreUnderTest) {
	s := open(t).Store
	must(t, s.Heartbeat(ctx, "a"), "heartbeat a")
	must(t, s.Heartbeat(ctx, "b"), "heartbeat b")
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := s.Members(lctx)
	must(t, err, "members")
	if slices.Sort(m); !slices.Equal(m, []string{"a", "b"}) {
		t.Fatalf("members %v, want [a b]", m)
	}
	must(t, s.Leave(ctx, "a"), "leave")
	if m, err := s.Members(lctx); err != nil || !slices.Equal(m, []string{"b"}) {
		t.Fatalf("members after a left: %v %v, want [b]", m, err)
	}
}

func leasesWatchInPlaceThenChanges(t *testing.T, ctx context.Context, open func(t *testing.T) LeaseStoreUnderTest) {
	s := open(t).Store
	rev, _, err := s.Acquire(ctx, 4, "a")
	must(t, err, "acquire")
	w := watch(t, s)
	w.want(t, change{4, "a", false})
	rev2, _, err := s.Renew(ctx, 4, "a", rev)
	must(t, err, "renew")
	w.want(t, change{4, "a", false})
	must(t, s.Heartbeat(ctx, "b"), "heartbeat")
	w.want(t, change{-1, "b", false})
	must(t, s.Release(ctx, 4, rev2), "release")
	w.want(t, change{4, "", true}) // a release names nobody: a delete marker has no value
	w.revisionsRise(t)
}

func leasesExpiryLeavesNoTrace(t *testing.T, ctx context.Context, open func(t *testing.T) LeaseStoreUnderTest) {
	u := open(t)
	s := u.Store
	rev, _, err := s.Acquire(ctx, 6, "a")
	must(t, err, "acquire")
	w := watch(t, s)
	w.want(t, change{6, "a", false})
	u.Expire()
	if _, ok, err := s.Renew(ctx, 6, "a", rev); ok || err != nil {
		t.Fatalf("renew after the expiry: ok %v err %v; want lost", ok, err)
	}
	if _, ok, err := s.Acquire(ctx, 6, "b"); !ok || err != nil {
		t.Fatalf("acquire after the expiry: ok %v err %v", ok, err)
	}
	w.want(t, change{6, "b", false}) // and no release of a's before it
}

// change is what a test expects of one change the watch reports: p is -1 for a heartbeat.
type change struct {
	p        int
	owner    string
	released bool
}

type watched struct {
	mu   sync.Mutex
	got  []change
	revs []uint64
	more chan struct{}
}

func watch(t *testing.T, s lease.Store) *watched {
	t.Helper()
	w := &watched{more: make(chan struct{}, 64)}
	stop, err := s.WatchLeases(context.Background(), func(c request.LeaseChange) {
		p := c.Partition
		if c.Heartbeat {
			p = -1 // as change writes a heartbeat
		}
		w.mu.Lock()
		w.got = append(w.got, change{p, c.Owner, c.Released})
		w.revs = append(w.revs, c.Rev)
		w.mu.Unlock()
		w.more <- struct{}{}
	}, func(error) {})
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	t.Cleanup(stop)
	return w
}

// want waits for the watch's next change and checks it.
func (w *watched) want(t *testing.T, c change) {
	t.Helper()
	select {
	case <-w.more:
	case <-time.After(10 * time.Second):
		t.Fatalf("the watch gave nothing in 10 s; want %+v", c)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if got := w.got[0]; got != c {
		t.Fatalf("watch gave %+v, want %+v (all so far: %+v)", got, c, w.got)
	}
	w.got = w.got[1:]
}

func (w *watched) revisionsRise(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := 1; i < len(w.revs); i++ {
		if w.revs[i] <= w.revs[i-1] {
			t.Fatalf("revisions %v do not rise", w.revs)
		}
	}
}

// SourceUnderTest is a fresh, empty queue for ConformSource, and how to queue a request
// in it as ingest does.
type SourceUnderTest struct {
	Source dispatch.Source
	Add    func(client, id string)
}

// ConformSource checks what the dispatcher relies on of the queue.
func ConformSource(t *testing.T, open func(t *testing.T) SourceUnderTest) {
	ctx := context.Background()
	u := open(t)
	src := u.Source
	lanes := make(chan request.Lane, 16)
	stop, err := src.Watch(ctx, allPartitions(src), func(l request.Lane) { lanes <- l }, func(error) {})
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	defer stop()
	u.Add("alice", "a1")
	u.Add("alice", "a2")
	u.Add("bob", "b1")
	var alice, bob request.Lane
	for range 3 {
		select {
		case l := <-lanes:
			switch id, _ := l.ClientID(); id {
			case "alice":
				alice = l
			case "bob":
				bob = l
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the watch did not give the lanes of the requests queued")
		}
	}
	// A kept final event is no request: the listing and the head below do not see it.
	kept := request.Event{Type: request.EventDelivered, ID: request.NewID(time.Now()), ClientID: "alice", Seq: 1, Attempt: 1, At: time.Now()}
	if err := src.KeepOutcome(ctx, kept); err != nil {
		t.Fatalf("keeping a final event: %v", err)
	}
	p := alice.Partition
	if p < 0 || p >= src.Partitions() || bob.Token != request.EncodeClientID("bob") {
		t.Fatalf("alice's lane %+v (partition of %d), bob's %+v", alice, src.Partitions(), bob)
	}
	conformBacklog(t, ctx, src, p, alice)
	st, ok, err := src.Head(ctx, alice)
	if err != nil || !ok || st.ID != "a1" || st.ClientID != "alice" || st.Lane != alice || st.Subject != alice.Subject() {
		t.Fatalf("head %+v %v %v; want a1 of alice, on her lane", st, ok, err)
	}
	conformFind(t, ctx, src, alice, bob, st.Seq)
	if err := src.AddDeadLetter(ctx, st, request.Verdict{Reason: request.ReasonPermanent}); err != nil {
		t.Fatalf("dead-letter: %v", err)
	}
	if again, _, _ := src.Head(ctx, alice); again.ID != "a1" {
		t.Fatalf("after dead-lettering a1 the head is %s; a dead letter stays queued until deleted", again.ID)
	}
	if err := src.Delete(ctx, alice, st.Seq); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if err := src.Delete(ctx, alice, st.Seq); !errors.Is(err, request.ErrNotQueued) {
		t.Fatalf("delete of one already gone: %v, want request.ErrNotQueued", err)
	}
	if st2, ok, err := src.Head(ctx, alice); err != nil || !ok || st2.ID != "a2" || st2.Seq <= st.Seq {
		t.Fatalf("head after the delete %+v %v %v; want a2, later", st2, ok, err)
	}
	st2, _, _ := src.Head(ctx, alice)
	if err := src.Delete(ctx, alice, st2.Seq); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, ok, err := src.Head(ctx, alice); ok || err != nil {
		t.Fatalf("head of an empty lane: ok %v err %v; want none", ok, err)
	}
	if _, ok, err := src.Find(ctx, alice, "a2"); ok || err != nil {
		t.Fatalf("find a2 once deleted: ok %v err %v; want not there", ok, err)
	}
	conformPartitionWatch(t, ctx, u, lanes)
}

func allPartitions(src dispatch.Source) []int {
	all := make([]int, src.Partitions())
	for p := range all {
		all[p] = p
	}
	return all
}

// conformPartitionWatch checks a watch of some partitions: it gives the lanes of their
// new requests only, and a watch of none is refused (it would be a watch of all). all
// gives the lanes of a watch of every partition.
func conformPartitionWatch(t *testing.T, ctx context.Context, u SourceUnderTest, all <-chan request.Lane) {
	t.Helper()
	src := u.Source
	if stop, err := src.Watch(ctx, nil, func(request.Lane) {}, func(error) {}); err == nil {
		stop()
		t.Fatal("a watch of no partition was started")
	}
	// Two clients in different partitions, found from where their requests go.
	var first, other request.Lane
	for i := 0; other.Token == ""; i++ {
		if i == 16 {
			t.Fatal("16 clients in one partition")
		}
		u.Add(fmt.Sprintf("watch-%d", i), fmt.Sprintf("x%d", i)) // ids unique: the queue drops a repeated one
		select {
		case l := <-all:
			if first.Token == "" {
				first = l
			} else if l.Partition != first.Partition {
				other = l
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the watch of every partition gave no lane")
		}
	}
	lanes := make(chan request.Lane, 16)
	stop, err := src.Watch(ctx, []int{first.Partition}, func(l request.Lane) { lanes <- l }, func(error) {})
	if err != nil {
		t.Fatalf("watch of partition %d: %v", first.Partition, err)
	}
	defer stop()
	add := func(l request.Lane, id string) {
		client, err := l.ClientID()
		must(t, err, "client of "+l.String())
		u.Add(client, id)
	}
	add(other, "o1")
	add(first, "f1")
	select {
	case l := <-lanes:
		if l != first {
			t.Fatalf("the watch of partition %d gave %s first; want %s (%s's request, in partition %d, came before)", first.Partition, l, first, other, other.Partition)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch of one partition did not give its request's lane")
	}
}

// conformFind checks Find: a request behind the head (at headSeq), by id in its client's
// lane, headers only; not in another client's lane, nor an id never queued.
func conformFind(t *testing.T, ctx context.Context, src dispatch.Source, alice, bob request.Lane, headSeq uint64) {
	t.Helper()
	if f, ok, err := src.Find(ctx, alice, "a2"); err != nil || !ok || f.ID != "a2" || f.ClientID != "alice" || f.Seq <= headSeq || f.Lane != alice || f.Subject != alice.Subject() || len(f.Body) != 0 {
		t.Fatalf("find a2 in alice's lane: %+v %v %v; want a2 behind a1, without its body", f, ok, err)
	}
	if _, ok, err := src.Find(ctx, bob, "a2"); ok || err != nil {
		t.Fatalf("find a2 in bob's lane: ok %v err %v; want not there", ok, err)
	}
	if _, ok, err := src.Find(ctx, alice, "zz"); ok || err != nil {
		t.Fatalf("find an id never queued: ok %v err %v; want not there", ok, err)
	}
}

// conformBacklog checks partition p's backlog: two requests in alice's lane, and only
// lanes of p.
func conformBacklog(t *testing.T, ctx context.Context, src dispatch.Source, p int, alice request.Lane) {
	t.Helper()
	backlog, err := src.PartitionBacklog(ctx, p)
	if err != nil || backlog[alice] != 2 {
		t.Fatalf("partition %d's backlog %v, %v; want 2 in %s", p, backlog, err, alice)
	}
	for lane := range backlog {
		if lane.Partition != p {
			t.Fatalf("partition %d's backlog lists %s", p, lane)
		}
	}
}

// quiet is one instance of a world without faults: the conformance suites run the
// simulation's ports through it.
func quiet(ttl time.Duration) *Instance {
	w := &World{ctx: context.Background(), cfg: dispatch.Config{LeaseTTL: ttl, SendTimeout: time.Second}, start: time.Now(),
		store: NewStore(ttl), queue: NewQueue(Partitions), raven: &Raven{}, kills: map[string]time.Time{}, deletes: map[uint64][]deleteCall{}, finals: map[uint64]bool{}}
	return newInstance(w, "conformance", "conformance")
}

// QuietLeaseStore is the simulation's lease store, without faults, for ConformLeaseStore.
func QuietLeaseStore(ttl time.Duration) LeaseStoreUnderTest {
	in := quiet(ttl)
	return LeaseStoreUnderTest{Store: &StoreView{s: in.w.store, in: in}, Expire: func() { in.w.store.Jump(2 * ttl) }}
}

// QuietSource is the simulation's queue, without faults, for ConformSource.
func QuietSource() SourceUnderTest {
	in := quiet(30 * time.Second)
	return SourceUnderTest{Source: &QueueView{q: in.w.queue, in: in}, Add: func(client, id string) { in.w.queue.Add(client, id, []byte(`{}`)) }}
}
