package schedule

import (
	"container/heap"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// laneState is where a lane is: each state but busy ones keeps it in the waiting heap
// or out of it, as its comment says.
type laneState uint8

const (
	// waiting: in the heap, due at lane.due.
	waiting laneState = iota
	// idle: in the heap with nothing queued, only to be forgotten once an interval has
	// passed since its last attempt (a request arriving meanwhile makes it waiting).
	idle
	// inFlight: with a worker, out of the heap.
	inFlight
	// inFlightStale: with a worker, and a request arrived or the steering changed since
	// it was handed out: the lane is looked at again when the worker is done.
	inFlightStale
	// parked: its client is paused; out of the heap until resumed.
	parked
)

func (st laneState) busy() bool { return st == inFlight || st == inFlightStale }

// String is the state as operators see it (LaneInfo.State).
func (st laneState) String() string {
	switch st {
	case waiting:
		return LaneWaiting
	case idle:
		return LaneIdle
	case parked:
		return LanePaused
	default:
		return LaneInFlight
	}
}

// lane is one client's place in the scheduler.
type lane struct {
	key          request.Lane
	state        laneState
	due          time.Time
	notBefore    time.Time // what asked for due, before spacing pushed it later
	index        int       // position in the heap; -1 when out of it
	lastEnd      time.Time
	since        time.Time // the fence: an earlier owner's attempt may have ended this late
	headSeq      uint64
	attempts     int
	firstAttempt time.Time
	heldSince    time.Time // due since then, and each look since held back or failed before an attempt (zero: not so)
}

// laneHeap orders waiting lanes by due time.
type laneHeap []*lane

func (h laneHeap) Len() int           { return len(h) }
func (h laneHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h laneHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *laneHeap) Push(x any) {
	l := x.(*lane)
	l.index = len(*h)
	*h = append(*h, l)
}
func (h *laneHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	l.index = -1
	*h = old[:len(old)-1]
	return l
}

// Lane states, as LaneInfo.State.
const (
	LaneWaiting  = "waiting"   // due at LaneInfo.NextSend
	LaneInFlight = "in_flight" // a worker is reading or sending its head request
	LanePaused   = "paused"    // parked until the client is resumed
	LaneIdle     = "idle"      // nothing queued; kept until an interval has passed
)

// LaneInfo is what the scheduler knows of one lane, for operators.
type LaneInfo struct {
	Lane     request.Lane  `json:"-"`
	Subject  string        `json:"subject"` // the lane's, in the queue
	State    string        `json:"state"`
	NextSend time.Time     `json:"nextSend,omitzero"` // earliest start of its next attempt, when waiting
	Attempts int           `json:"attempts"`          // failed attempts of the head request so far
	LastEnd  time.Time     `json:"lastAttemptEnd,omitzero"`
	Interval time.Duration `json:"interval"`
	// LastDelivered is the end of the client's last delivered attempt this instance
	// remembers; zero when it remembers none.
	LastDelivered time.Time `json:"lastDelivered,omitzero"`
}

// Lane describes key's lane; false when there is none.
func (s *Scheduler) Lane(key request.Lane) (LaneInfo, bool) {
	l := s.lanes[key]
	if l == nil {
		return LaneInfo{}, false
	}
	return s.info(l), true
}

// LaneInfos describes up to limit lanes, in no particular order.
func (s *Scheduler) LaneInfos(limit int) []LaneInfo {
	limit = max(limit, 0)
	out := make([]LaneInfo, 0, min(limit, len(s.lanes)))
	for _, l := range s.lanes {
		if len(out) == limit {
			break
		}
		out = append(out, s.info(l))
	}
	return out
}

func (s *Scheduler) info(l *lane) LaneInfo {
	li := LaneInfo{Lane: l.key, Subject: l.key.Subject(), State: l.state.String(), Attempts: l.attempts, LastEnd: l.lastEnd, Interval: s.IntervalOf(l.key)}
	if l.state == waiting {
		li.NextSend = l.due
	}
	return li
}

// DueLanes describes up to limit waiting lanes with something queued, the earliest due
// first. It walks the heap from its root, so it costs about limit·log(limit), not the
// number of lanes.
func (s *Scheduler) DueLanes(limit int) []LaneInfo {
	var out []LaneInfo
	// next holds heap positions whose parents were taken, ordered by due.
	next := &dueFrontier{h: s.waiting}
	if len(s.waiting) > 0 {
		heap.Push(next, 0)
	}
	for next.Len() > 0 && len(out) < limit {
		i := heap.Pop(next).(int)
		if l := s.waiting[i]; l.state == waiting {
			out = append(out, s.info(l))
		}
		for _, c := range []int{2*i + 1, 2*i + 2} {
			if c < len(s.waiting) {
				heap.Push(next, c)
			}
		}
	}
	return out
}

// dueFrontier is a heap of positions in a laneHeap, by their lanes' due times.
type dueFrontier struct {
	h   laneHeap
	pos []int
}

func (f *dueFrontier) Len() int           { return len(f.pos) }
func (f *dueFrontier) Less(i, j int) bool { return f.h[f.pos[i]].due.Before(f.h[f.pos[j]].due) }
func (f *dueFrontier) Swap(i, j int)      { f.pos[i], f.pos[j] = f.pos[j], f.pos[i] }
func (f *dueFrontier) Push(x any)         { f.pos = append(f.pos, x.(int)) }
func (f *dueFrontier) Pop() any {
	x := f.pos[len(f.pos)-1]
	f.pos = f.pos[:len(f.pos)-1]
	return x
}
