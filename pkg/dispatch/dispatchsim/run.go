package dispatchsim

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Partitions is how many partitions the simulated queue spreads clients over.
const Partitions = 8

// Report is what one run found.
type Report struct {
	Seed     uint64
	Faults   int // faults in its timeline
	Requests int
	Attempts int
	// Cancels is how many cancels were answered, by outcome (cancelled, in_flight, ...).
	Cancels    map[string]int
	Violations []string
	// Overdue is the lanes the live instances counted overdue at the end (their
	// dispatch_lanes_overdue): a stall the metric shows.
	Overdue int
	// Detail says, when something broke, what the run was, the timeline of the client
	// that broke and the end of what the instances logged about leases.
	Detail string
}

// event is a step of the run's controller: something happens at at.
type event struct {
	at time.Duration
	do func()
}

// Run runs seed's schedule and checks it. It must run inside a testing/synctest bubble:
// its minutes of operation take no time.
func Run(seed uint64) *Report {
	w := newWorld(seed)
	defer w.end()
	set, faults := w.set, w.timeline
	steps := w.queueClients(rand.New(rand.NewPCG(seed, 0xa11)))
	steps = append(steps, w.arrivalsAround(faults, rand.New(rand.NewPCG(seed, 0xa12)))...)
	for i := range set.Instances {
		w.join(fmt.Sprintf("i%d", i+1))
	}
	w.nextID = set.Instances + 1
	for _, f := range faults {
		switch f.Kind {
		case FaultPause:
			steps = append(steps, event{at: f.From, do: func() {
				if in := w.liveByID(f.Instance); in != nil {
					in.pause()
					w.note("%s paused", in.name)
				}
			}}, event{at: f.To, do: func() {
				if in := w.liveByID(f.Instance); in != nil {
					in.resume()
					w.note("%s resumed", in.name)
				}
			}})
		case FaultJump:
			steps = append(steps, event{at: f.From, do: func() {
				w.store.Jump(f.Arg)
				w.note("the store's clock jumps %s ahead", f.Arg)
			}})
		case FaultJoin:
			steps = append(steps, event{at: f.From, do: func() { w.join(w.newID()) }})
		case FaultLeave:
			steps = append(steps, event{at: f.From, do: func() {
				if in := w.pick(f.pick); in != nil {
					w.note("%s leaves", in.name)
					w.drop(in)
					in.stop()
					w.note("%s left", in.name)
				}
			}})
		case FaultKill:
			steps = append(steps, event{at: f.From, do: func() {
				in := w.pick(f.pick)
				if in == nil {
					return
				}
				w.note("%s killed", in.name)
				w.drop(in)
				w.mu.Lock()
				w.kills[in.name] = time.Now()
				w.mu.Unlock()
				in.kill()
				id := in.id
				if !f.SameID {
					id = w.newID()
				}
				steps = append(steps, event{at: time.Since(w.start) + f.Arg, do: func() { w.join(id) }})
				slices.SortStableFunc(steps, func(a, b event) int { return cmp.Compare(a.at, b.at) })
			}})
		}
	}
	steps = append(steps, w.cancelSteps()...)
	slices.SortStableFunc(steps, func(a, b event) int { return cmp.Compare(a.at, b.at) })
	for len(steps) > 0 {
		s := steps[0]
		steps = steps[1:]
		time.Sleep(time.Until(w.start.Add(s.at)))
		s.do()
	}
	time.Sleep(time.Until(w.start.Add(set.Faults)))
	if len(w.liveNow()) == 0 {
		w.join(w.newID())
	}
	w.note("faults over")
	time.Sleep(time.Until(w.start.Add(set.Faults + set.Bound)))
	return w.finish()
}

// newWorld is seed's world, its clock started: the setting and faults it draws, and the
// simulated services.
func newWorld(seed uint64) *World {
	set, faults := settingOf(seed)
	ctx, end := context.WithCancel(context.Background())
	w := &World{seed: seed, set: set, cfg: set.Config, start: time.Now(), ctx: ctx, end: end,
		store: NewStore(set.Config.LeaseTTL), queue: NewQueue(Partitions), raven: &Raven{}, timeline: faults,
		kills: map[string]time.Time{}, deletes: map[uint64][]deleteCall{}, finals: map[uint64]bool{}}
	w.store.note = w.note
	return w
}

// queueClients queues each client's first requests, and returns the steps that queue
// the rest while the faults run, at times drawn from r.
func (w *World) queueClients(r *rand.Rand) []event {
	set := w.set
	var steps []event
	for c := range set.Clients + set.Busy {
		client := fmt.Sprintf("c%02d", c)
		n := 0
		add := func() {
			w.queue.Add(client, fmt.Sprintf("%s-r%04d", client, n), []byte(`{}`))
			n++
		}
		queued := set.Requests
		if c >= set.Clients {
			client, queued = fmt.Sprintf("busy%d", c-set.Clients), set.BusyRequests
		}
		for range queued {
			add()
		}
		for range r.IntN(set.Arrivals + 1) {
			steps = append(steps, event{at: time.Duration(r.Int64N(int64(set.Faults))), do: add})
		}
		if c < set.Clients {
			w.adders = append(w.adders, add)
		}
	}
	return steps
}

// arrivalsPerMove is how many requests arrive around each instant the partitions move.
const arrivalsPerMove = 3

// arrivalsAround queues requests of clients with a short backlog (most often none left)
// in the seconds after each instance joins, leaves or is killed: the partitions move
// then, and each instance's backlog watch is started again over its new share. A request
// stored while a watch is being replaced reaches the loop only if the replacement is
// right (ADR 16); spread over the whole run, few would fall there.
func (w *World) arrivalsAround(faults []Fault, r *rand.Rand) []event {
	var steps []event
	for _, f := range faults {
		if f.Kind != FaultJoin && f.Kind != FaultLeave && f.Kind != FaultKill || len(w.adders) == 0 {
			continue
		}
		for range arrivalsPerMove {
			at := f.From + time.Duration(r.Int64N(int64(4*time.Second)))
			steps = append(steps, event{at: min(at, w.set.Faults), do: w.adders[r.IntN(len(w.adders))]})
		}
	}
	return steps
}

// finish ends the run once its bound has passed: it stops every instance and checks what
// happened.
func (w *World) finish() *Report {
	left := w.queue.Queued()
	overdue := 0 // what the instances' dispatch_lanes_overdue says of a stall, at the end
	for _, in := range w.liveNow() {
		overdue += in.d.Stats().Overdue
	}
	for _, in := range w.liveNow() {
		in.kill()
	}
	w.end()
	rep := w.check(left)
	w.mu.Lock()
	rep.Cancels = maps.Clone(w.cancelAnswers)
	w.mu.Unlock()
	rep.Overdue = overdue
	return rep
}

func (w *World) newID() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.nextID++
	return fmt.Sprintf("i%d", w.nextID-1)
}

// join starts an instance with id.
func (w *World) join(id string) {
	w.mu.Lock()
	k := 1
	for _, in := range w.instances {
		if in.id == id {
			k++
		}
	}
	name := id
	if k > 1 {
		name = fmt.Sprintf("%s#%d", id, k)
	}
	in := newInstance(w, id, name)
	w.instances = append(w.instances, in)
	w.live = append(w.live, in)
	w.mu.Unlock()
	if err := in.start(); err != nil {
		panic(fmt.Sprintf("starting %s: %v", name, err))
	}
	w.note("%s started", name)
}

func (w *World) liveNow() []*Instance {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.live)
}

func (w *World) liveByID(id string) *Instance {
	for _, in := range w.liveNow() {
		if in.id == id {
			return in
		}
	}
	return nil
}

// pick is a live instance chosen by n, nil when none runs.
func (w *World) pick(n int) *Instance {
	live := w.liveNow()
	if len(live) == 0 {
		return nil
	}
	return live[n%len(live)]
}

func (w *World) drop(in *Instance) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.live = slices.DeleteFunc(w.live, func(x *Instance) bool { return x == in })
}

func (w *World) byName(name string) *Instance {
	for _, in := range w.instances {
		if in.name == name {
			return in
		}
	}
	return nil
}

// detail is a failing run's report: the run, the timeline of each client that broke, and
// the last lines the instances logged about leases.
func (w *World) detail(broken map[string]bool, byClient map[string][]Attempt, at func(time.Time) string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %s", w.seed, Describe(w.seed))
	for _, client := range slices.Sorted(mapsKeys(broken)) {
		p := w.queue.Lane(client).Partition
		fmt.Fprintf(&b, "timeline of %s (partition %d):\n", client, p)
		for _, a := range byClient[client] {
			fmt.Fprintf(&b, "  %s-%s %s by %s: status %d accepted %v answered %v\n", at(a.Start), at(a.End), a.ID, a.Instance, a.Status, a.Accepted, a.Answered)
		}
	}
	w.mu.Lock()
	notes := w.notes
	if len(notes) > 250 {
		notes = notes[len(notes)-250:]
	}
	w.mu.Unlock()
	fmt.Fprintf(&b, "the instances' last lines about leases and partitions:\n")
	for _, n := range notes {
		fmt.Fprintf(&b, "  %s\n", n)
	}
	return b.String()
}
