// Package dispatchsim is a deterministic simulation of the dispatcher's ownership
// protocol (leases, fences, handovers): several instances of the real dispatcher (its
// leaser, loop, scheduler and attempt path, and the real raven client) run against a
// simulated lease store, queue, event writer and raven, on the simulated time of
// testing/synctest, while faults drawn from a seed hit them. After each run the
// guarantees are checked from raven's record: spacing (G2), order (G3), one in flight
// (G5), nothing lost, liveness once the faults are over, and from the queue's record that
// no request left the queue before its final event was stored (G10 across a crash).
//
// A seed fixes the run: the setting (TTL, interval, send timeout, instances, clients),
// the timeline of faults, and every per-call draw (each draw hashes the seed, the
// instance, the call and the simulated time, so that it does not depend on which
// goroutine asked first). What a seed does not fix is the order in which goroutines
// that are ready at the same simulated instant run: Go's scheduler picks it. A failing
// seed replays the same faults at the same times; its failure almost always repeats.
package dispatchsim

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// Fault kinds. A window of one hits the instance it names (or all) from its start to
// its end; "jump", "kill", "join" and "leave" happen at an instant.
const (
	FaultStoreSlow    = "store-slow"     // lease store answers after a renewal's timeout, before the NATS client's
	FaultStoreErrors  = "store-errors"   // lease store calls fail (they do not land)
	FaultStoreLost    = "store-lost"     // lease store answers lost: the call times out, and lands
	FaultListHangs    = "list-hangs"     // a listing of the instances never ends
	FaultWatchDelay   = "watch-delay"    // watch events arrive late (leases, new requests), and a backlog watch is slow to start
	FaultWatchEnds    = "watch-ends"     // the lease watch ends (and is started again)
	FaultWatchRepeats = "watch-repeats"  // lease watch events arrive twice
	FaultJump         = "clock-jump"     // the store's clock jumps ahead: leases expire early, unseen
	FaultPause        = "pause"          // an instance stops (SIGSTOP) and resumes
	FaultKill         = "kill"           // an instance is killed, and started again (same id or new)
	FaultJoin         = "join"           // a new instance starts
	FaultLeave        = "leave"          // an instance stops gracefully
	FaultRavenSlow    = "raven-slow"     // raven answers near or after the send timeout (late acceptance)
	FaultRavenRefuses = "raven-refuses"  // raven answers 500 or 503 (with Retry-After at times)
	FaultQueueErrors  = "queue-errors"   // queue reads and removals fail
	FaultEventsSlow   = "events-slow"    // the final event's write is slow
	FaultEventsFail   = "events-fail"    // the final event's write never answers
	FaultStoreSlowEnd = "store-slow-end" // a slow lease store that lasts to the end of the run (a degraded store, not an outage)
	FaultNATSTrouble  = "nats-trouble"   // an instance's NATS server in trouble: lease writes fail and event writes hang
)

var windowKinds = []string{FaultStoreSlow, FaultStoreErrors, FaultStoreLost, FaultListHangs, FaultWatchDelay,
	FaultWatchEnds, FaultWatchRepeats, FaultPause, FaultRavenSlow, FaultRavenRefuses, FaultQueueErrors,
	FaultEventsSlow, FaultEventsFail, FaultNATSTrouble}

var instantKinds = []string{FaultJump, FaultKill, FaultJoin, FaultLeave}

// Fault is one fault of a run's timeline, in simulated time from the run's start.
type Fault struct {
	Kind     string
	Instance string // the instance it hits ("" all; for kill and leave, picked when it happens)
	From, To time.Duration
	Arg      time.Duration // a jump's size; a kill's restart delay
	SameID   bool          // a kill's restart keeps the instance's id
	pick     int
}

func (f Fault) String() string {
	at := fmt.Sprintf("%6.2fs", f.From.Seconds())
	if f.To > f.From {
		at += fmt.Sprintf("-%.2fs", f.To.Seconds())
	}
	s := at + " " + f.Kind
	if f.Instance != "" {
		s += " " + f.Instance
	}
	switch f.Kind {
	case FaultJump:
		s += fmt.Sprintf(" by %s", f.Arg)
	case FaultKill:
		s += fmt.Sprintf(", restarted %s later (same id: %v)", f.Arg, f.SameID)
	}
	return s
}

// Setting is what a seed chose for one run.
type Setting struct {
	Config    dispatch.Config
	Instances int // at the start
	Clients   int
	Requests  int // queued before the start, per client
	Arrivals  int // at most, per client, during the faults
	// Busy clients have BusyRequests queued before the start: enough to keep sending
	// through most of the faults, so that a handover meets a client with a backlog.
	Busy         int
	BusyRequests int
	Faults       time.Duration // how long faults are drawn over
	Bound        time.Duration // liveness: after the faults, every request delivered within this
}

// World is one run: the simulated services, the instances and the faults.
type World struct {
	seed     uint64
	set      Setting
	cfg      dispatch.Config
	start    time.Time
	ctx      context.Context // ends with the run: calls that hang give up then
	end      context.CancelFunc
	store    *Store
	queue    *Queue
	raven    *Raven
	timeline []Fault

	mu            sync.Mutex
	instances     []*Instance // every one that ran
	live          []*Instance
	kills         map[string]time.Time // instance name: when killed
	deletes       map[uint64][]deleteCall
	finals        map[uint64]bool   // requests whose final event is stored (events or queue)
	cancelEvents  map[string]uint64 // requests whose stored final event is a cancel's: their sequence
	unkept        [][2]string       // G10: removals that landed before the final event was stored (client, what)
	cancelled     []cancelCall      // cancels answered Cancelled
	cancelAnswers map[string]int    // cancels answered, by outcome
	notes         []string
	nextID        int
	adders        []func() // each client with a short backlog: queues its next request
}

// deleteCall is one removal of a request from the queue, or (keep) the keeping of its
// final event in the queue that comes first when the events did not take it.
type deleteCall struct {
	in             string
	called, landed time.Time // landed zero: it did not
	failed         bool
	keep           bool
}

// draw is what the faults make of one call.
type drawn struct {
	latency    time.Duration
	refuse     bool
	hang       bool
	status     int
	retryAfter time.Duration
}

// draw decides one call's fate from the seed, the instance, the call and the time, and
// the fault windows open now.
func (w *World) draw(in *Instance, port, what string, key int) drawn {
	now := time.Now()
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s/%s/%s/%d/%d", w.seed, in.name, port, what, key, now.UnixNano())
	r := rand.New(rand.NewPCG(h.Sum64(), w.seed))
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(r.Int64N(int64(hi-lo)+1)) }
	d := drawn{status: 200}
	switch port {
	case portStore, portList:
		d.latency = between(time.Millisecond, 10*time.Millisecond)
	case portRaven:
		d.latency = between(5*time.Millisecond, 50*time.Millisecond)
	case portQueue:
		d.latency = between(time.Millisecond, 5*time.Millisecond)
		if what == "watched" && r.IntN(10) == 0 {
			// A consumer's delivery lags at times (the server busy, the connection's
			// buffer full): a watch replaced then still held it.
			d.latency = between(10*time.Millisecond, time.Second)
		}
	default:
		d.latency = between(time.Millisecond, 5*time.Millisecond)
	}
	every := leaseEvery(w.cfg)
	for _, f := range w.active(in, now) {
		switch {
		case f.Kind == FaultStoreSlow || f.Kind == FaultStoreSlowEnd:
			if port == portStore || port == portList {
				// Slower than a renewal period (what a renewal waited for before), faster
				// than the NATS client's timeout, and by a quarter period at most: a
				// store slow enough to time renewals out that waited a period, and quick
				// enough for a round to renew every lease well within its TTL.
				d.latency = between(every+every/10, every+every/4)
			}
		case (f.Kind == FaultStoreErrors || f.Kind == FaultNATSTrouble) && (port == portStore || port == portList):
			d.refuse = r.IntN(4) != 0
		case f.Kind == FaultStoreLost && port == portStore:
			if r.IntN(3) == 0 {
				d.latency = between(natsTimeout, 2*natsTimeout)
			}
		case f.Kind == FaultListHangs && port == portList:
			d.hang = r.IntN(2) == 0
		case f.Kind == FaultRavenSlow && port == portRaven:
			d.latency = between(w.cfg.SendTimeout/2, 2*w.cfg.SendTimeout)
		case f.Kind == FaultRavenRefuses && port == portRaven:
			d.status = []int{500, 503, 503}[r.IntN(3)]
			if r.IntN(3) == 0 {
				d.retryAfter = time.Duration(1+r.IntN(3)) * time.Second
			}
		case f.Kind == FaultWatchDelay && port == portQueue && (what == "watched" || what == "watch"):
			// A request's lane reaches the loop late, and a watch started again while
			// the old one still holds some gives them only if they were stored after
			// it started.
			d.latency = between(0, 2*time.Second)
		case f.Kind == FaultQueueErrors && port == portQueue:
			d.refuse = r.IntN(2) == 0
		case f.Kind == FaultEventsSlow && port == portEvents:
			d.latency = between(time.Second/2, 3*time.Second)
		case (f.Kind == FaultEventsFail || f.Kind == FaultNATSTrouble) && port == portEvents:
			d.hang = true
		}
	}
	return d
}

// watchFault is what the faults do to one lease watch event: its delay, and whether it
// is delivered twice or ends the watch.
func (w *World) watchFault(in *Instance, c Change) (delay time.Duration, twice, end bool) {
	now := time.Now()
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s/watch/%d/%d", w.seed, in.name, c.Rev, now.UnixNano())
	r := rand.New(rand.NewPCG(h.Sum64(), w.seed))
	for _, f := range w.active(in, now) {
		switch f.Kind {
		case FaultWatchDelay:
			delay = time.Duration(r.Int64N(int64(2 * time.Second)))
		case FaultWatchRepeats:
			twice = r.IntN(3) == 0
		case FaultWatchEnds:
			end = r.IntN(10) == 0
		}
	}
	return delay, twice, end
}

// active is the fault windows open at now that hit in.
func (w *World) active(in *Instance, now time.Time) []Fault {
	var out []Fault
	at := now.Sub(w.start)
	for _, f := range w.timeline {
		if f.To <= f.From || at < f.From || at >= f.To {
			continue
		}
		if f.Instance == "" || f.Instance == in.id {
			out = append(out, f)
		}
	}
	return out
}

// note keeps a line for the failure report, stamped with the simulated time.
func (w *World) note(format string, args ...any) {
	line := fmt.Sprintf("%8.3fs ", time.Since(w.start).Seconds()) + fmt.Sprintf(format, args...)
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.notes) >= 4000 {
		w.notes = w.notes[1000:]
	}
	w.notes = append(w.notes, line)
}

func (w *World) deleted(in *Instance, seq uint64, called, landed time.Time, failed bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.deletes[seq] = append(w.deletes[seq], deleteCall{in: in.name, called: called, landed: landed, failed: failed})
}

// kept notes one keeping of seq's final event in the queue by in: the first step of its
// removal then.
func (w *World) kept(in *Instance, seq uint64, called, landed time.Time, failed bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.deletes[seq] = append(w.deletes[seq], deleteCall{in: in.name, called: called, landed: landed, failed: failed, keep: true})
}

// finalStored notes that request seq's final event is stored: in the events, or kept in
// the queue.
func (w *World) finalStored(e request.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.finals[e.Seq] = true
	if e.Type == request.EventCancelled {
		if w.cancelEvents == nil {
			w.cancelEvents = map[string]uint64{}
		}
		w.cancelEvents[e.ID] = e.Seq
	}
}

// removedFinal notes st's removal from the queue by in: its final event must be stored by
// then, or a crash of in right now loses it (G10).
func (w *World) removedFinal(in *Instance, st request.Stored) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.finals[st.Seq] {
		w.unkept = append(w.unkept, [2]string{st.ClientID, fmt.Sprintf("G10: %s's %s removed by %s at %.3fs before its final event was stored anywhere: a crash then loses it",
			st.ClientID, st.ID, in.name, time.Since(w.start).Seconds())})
	}
}

// leaseMargin and leaseEvery are the dispatcher's (config.go), for the faults' scale.
func leaseMargin(c dispatch.Config) time.Duration { return c.SendTimeout + c.LeaseTTL/10 }
func leaseEvery(c dispatch.Config) time.Duration  { return (c.LeaseTTL - leaseMargin(c)) / 3 }

// settingOf is what seed chooses: a TTL short enough that the margins are tight, an
// interval, a send timeout, and the swarm of faults this run draws from.
func settingOf(seed uint64) (Setting, []Fault) {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	pick := func(ds ...time.Duration) time.Duration { return ds[r.IntN(len(ds))] }
	cfg := dispatch.Config{
		Policy: schedule.Policy{
			Interval:    pick(500*time.Millisecond, time.Second, 2*time.Second),
			BackoffBase: 100 * time.Millisecond,
			BackoffMax:  2 * time.Second,
			Jitter:      1e-9, // the dispatcher's own randomness is global: keep it out of the run
			MaxAttempts: 1000,
			MaxAge:      24 * time.Hour,
		},
		MaxInFlight:      64,
		ShutdownGrace:    2 * time.Second,
		ResyncEvery:      5 * time.Second,
		SendTimeout:      pick(500*time.Millisecond, time.Second),
		LeaseTTL:         pick(3*time.Second, 6*time.Second, 10*time.Second),
		RecentDeliveries: -1,
		AttemptHistory:   -1,
	}
	if rand.New(rand.NewPCG(seed, 0x7e5c)).IntN(2) == 0 { // a draw of its own: the other draws stay each seed's
		// No listing of the backlog on a timer: every request must reach an owner
		// through the watch, or the listing when a partition is taken or the watch
		// changes. A missed one then breaks liveness, where a resync would hide it.
		cfg.ResyncEvery = 24 * time.Hour
	}
	set := Setting{Config: cfg, Instances: 1 + r.IntN(4), Clients: 4 + r.IntN(12), Requests: 1 + r.IntN(4),
		Busy: 1 + r.IntN(4), Arrivals: r.IntN(12), Faults: 60 * time.Second}
	set.BusyRequests = int(set.Faults/cfg.Interval) / (1 + r.IntN(3))
	every := leaseEvery(cfg)
	// Every request out within: two TTLs (a lease that lapsed unseen, then the fence of
	// its last renewal), a renewal round, the longest backoff, and the longest backlog's
	// own spacing with a send timeout each.
	backlog := time.Duration(max(set.Requests+set.Arrivals, set.BusyRequests)) * (cfg.Interval + cfg.SendTimeout)
	set.Bound = 2*cfg.LeaseTTL + every + cfg.Interval + cfg.BackoffMax + backlog + 10*time.Second

	faults := swarm(r, &set)
	slices.SortStableFunc(faults, func(a, b Fault) int { return int(a.From - b.From) })
	for _, f := range faults {
		if f.Kind == FaultJoin || f.Kind == FaultLeave || f.Kind == FaultKill {
			// The requests queued around the move (arrivalsAround), each perhaps on one
			// client's backlog.
			set.Bound += arrivalsPerMove * (cfg.Interval + cfg.SendTimeout)
		}
	}
	return set, faults
}

// swarm draws a run's faults: each run draws from some of the fault kinds only, so that
// each kind meets the others in many combinations and hits hard when it does. A store
// slow to the end lengthens set's bound.
func swarm(r *rand.Rand, set *Setting) []Fault {
	cfg := set.Config
	var faults []Fault
	instance := func() string {
		if r.IntN(3) == 0 {
			return ""
		}
		return fmt.Sprintf("i%d", 1+r.IntN(set.Instances+2))
	}
	for _, k := range windowKinds {
		if r.IntN(3) != 0 {
			continue
		}
		for range 1 + r.IntN(3) {
			from := time.Duration(r.Int64N(int64(set.Faults)))
			long := 3 * cfg.LeaseTTL
			if k == FaultPause {
				long = 2 * cfg.LeaseTTL
			}
			to := min(from+time.Duration(r.Int64N(int64(long)))+200*time.Millisecond, set.Faults)
			f := Fault{Kind: k, Instance: instance(), From: from, To: to}
			if (k == FaultPause || k == FaultNATSTrouble) && f.Instance == "" {
				f.Instance = "i1"
			}
			faults = append(faults, f)
		}
	}
	for _, k := range instantKinds {
		if r.IntN(2) != 0 {
			continue
		}
		for range 1 + r.IntN(5) {
			f := Fault{Kind: k, From: time.Duration(r.Int64N(int64(set.Faults))), pick: r.IntN(1 << 20)}
			switch k {
			case FaultJump:
				f.Arg = cfg.LeaseTTL/3 + time.Duration(r.Int64N(int64(2*cfg.LeaseTTL)))
			case FaultKill:
				f.Arg = time.Duration(r.Int64N(int64(2 * cfg.LeaseTTL)))
				f.SameID = r.IntN(2) == 0
			}
			faults = append(faults, f)
		}
	}
	if r.IntN(6) == 0 {
		// A store that stays slow to the end: not an outage, so liveness must hold.
		from := time.Duration(r.Int64N(int64(set.Faults)))
		faults = append(faults, Fault{Kind: FaultStoreSlowEnd, Instance: instance(), From: from, To: set.Faults + set.Bound + time.Hour})
		set.Bound += 4 * cfg.LeaseTTL
	}
	return faults
}

// Faults lists a seed's timeline of faults, as its run will draw them.
func Faults(seed uint64) []Fault {
	_, f := settingOf(seed)
	return f
}

// Describe says what a seed's run is: its setting and its faults.
func Describe(seed uint64) string {
	set, faults := settingOf(seed)
	var b strings.Builder
	fmt.Fprintf(&b, "interval %s, lease TTL %s, send timeout %s, %d instances, %d clients with %d requests each and up to %d more arriving, %d busy clients with %d, faults over %s, liveness bound %s, backlog relisted every %s\n",
		set.Config.Interval, set.Config.LeaseTTL, set.Config.SendTimeout, set.Instances, set.Clients, set.Requests, set.Arrivals, set.Busy, set.BusyRequests, set.Faults, set.Bound, set.Config.ResyncEvery)
	for _, f := range faults {
		fmt.Fprintf(&b, "  %s\n", f)
	}
	return b.String()
}
