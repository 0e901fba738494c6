package dispatch

import (
	"container/list"
	"strconv"
	"sync"
	"time"

	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// What an instance did lately, kept for the operators' console: each client's last
// attempts (its kept gaps), and a rolling minute of attempts by outcome, raven's answers
// by status and latency, and dead letters by reason. Both are bounded in memory; neither
// is durable (a restarted instance starts them afresh).

// DefaultAttemptHistory is how many clients' last attempts an instance remembers, the
// most recently sent to first; HistoryPerClient is how many attempts of each.
const (
	DefaultAttemptHistory = 10_000
	HistoryPerClient      = 20
)

const (
	slotLength = 5 * time.Second
	slots      = int(introspect.ActivityWindow / slotLength)
)

type slot struct {
	epoch    int64 // start of the slot, in slotLengths since the Unix epoch
	outcomes map[schedule.Outcome]int
	statuses map[int]int // 0: no answer
	latency  []int
	dead     map[string]int
}

// activity keeps Activity's slots and each client's last attempts; safe for concurrent use.
type activity struct {
	mu      sync.Mutex
	slots   [slots]slot
	max     int
	order   *list.List // of *clientAttempts, most recently sent to first
	clients map[request.Lane]*list.Element
}

type clientAttempts struct {
	lane request.Lane
	ring [HistoryPerClient]attemptRecord
	n    int // attempts recorded in all
}

// attemptRecord is an Attempt as the ring keeps it: 56 bytes rather than 136.
type attemptRecord struct {
	id            string
	start, end    int64 // Unix nanoseconds
	gap, interval time.Duration
	attempt       int32
	status        int16
	outcome       uint8
	hasGap        bool
}

func record(at introspect.Attempt) attemptRecord {
	r := attemptRecord{id: at.ID, start: at.Start.UnixNano(), end: at.End.UnixNano(), gap: at.Gap, interval: at.Interval,
		attempt: int32(min(at.Attempt, 1<<31-1)), status: int16(at.Status), hasGap: at.HasGap, outcome: outcomeUnknown}
	for i, o := range schedule.Outcomes {
		if o == at.Outcome {
			r.outcome = uint8(i)
		}
	}
	return r
}

// outcomeUnknown stands for an outcome not among schedule.Outcomes: shown as "unknown",
// never as one it was not.
const outcomeUnknown = 255

func (r attemptRecord) Attempt() introspect.Attempt {
	outcome := schedule.Outcome("unknown")
	if int(r.outcome) < len(schedule.Outcomes) {
		outcome = schedule.Outcomes[r.outcome]
	}
	return introspect.Attempt{ID: r.id, Attempt: int(r.attempt), Start: time.Unix(0, r.start), End: time.Unix(0, r.end),
		Gap: r.gap, HasGap: r.hasGap, Interval: r.interval, Outcome: outcome, Status: int(r.status)}
}

func newActivity(maxClients int) *activity {
	return &activity{max: maxClients, order: list.New(), clients: map[request.Lane]*list.Element{}}
}

// at returns the slot for t, emptied when it last held an older window's counts.
func (a *activity) at(t time.Time) *slot {
	epoch := t.UnixNano() / int64(slotLength)
	s := &a.slots[epoch%int64(slots)]
	if s.epoch != epoch || s.outcomes == nil {
		*s = slot{epoch: epoch, outcomes: map[schedule.Outcome]int{}, statuses: map[int]int{}, latency: make([]int, len(introspect.LatencyBounds)+1), dead: map[string]int{}}
	}
	return s
}

// attempt records one attempt of lane's client.
func (a *activity) attempt(lane request.Lane, at introspect.Attempt) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.at(at.End)
	s.outcomes[at.Outcome]++
	s.statuses[at.Status]++
	took, b := at.End.Sub(at.Start), 0
	for b < len(introspect.LatencyBounds) && took > introspect.LatencyBounds[b] {
		b++
	}
	s.latency[b]++
	if a.max <= 0 {
		return
	}
	e, ok := a.clients[lane]
	if ok {
		a.order.MoveToFront(e)
	} else if a.order.Len() >= a.max {
		// Full: the least recently sent to makes room, its record reused.
		e = a.order.Back()
		c := e.Value.(*clientAttempts)
		delete(a.clients, c.lane)
		*c = clientAttempts{lane: lane}
		a.order.MoveToFront(e)
		a.clients[lane] = e
	} else {
		e = a.order.PushFront(&clientAttempts{lane: lane})
		a.clients[lane] = e
	}
	c := e.Value.(*clientAttempts)
	c.ring[c.n%HistoryPerClient] = record(at)
	c.n++
}

// deadLettered counts one dead letter for reason at now.
func (a *activity) deadLettered(reason request.Reason, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.at(now).dead[string(reason)]++
}

// history returns lane's last attempts, oldest first.
func (a *activity) history(lane request.Lane) []introspect.Attempt {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.clients[lane]
	if !ok {
		return nil
	}
	c := e.Value.(*clientAttempts)
	n := min(c.n, HistoryPerClient)
	out := make([]introspect.Attempt, 0, n)
	for i := c.n - n; i < c.n; i++ {
		out = append(out, c.ring[i%HistoryPerClient].Attempt())
	}
	return out
}

// lastDelivered is the end of lane's last delivered attempt it remembers.
func (a *activity) lastDelivered(lane request.Lane) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.clients[lane]
	if !ok {
		return time.Time{}
	}
	c := e.Value.(*clientAttempts)
	for i := c.n - 1; i >= max(c.n-HistoryPerClient, 0); i-- {
		if r := c.ring[i%HistoryPerClient]; r.outcome == 0 { // delivered
			return time.Unix(0, r.end)
		}
	}
	return time.Time{}
}

// window sums the slots of the last ActivityWindow before now.
func (a *activity) window(now time.Time) introspect.Activity {
	newest := now.UnixNano() / int64(slotLength)
	// The slots summed: slots-1 whole ones and the one now filling, which began at
	// newest; the counts cover that long, not the whole ActivityWindow.
	covered := time.Duration(slots-1)*slotLength + time.Duration(now.UnixNano()-newest*int64(slotLength))
	out := introspect.Activity{Window: covered, Outcomes: map[schedule.Outcome]int{}, Statuses: map[string]int{}, Latency: make([]int, len(introspect.LatencyBounds)+1), DeadLetters: map[string]int{}}
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range a.slots {
		s := &a.slots[i]
		if s.outcomes == nil || s.epoch <= newest-int64(slots) || s.epoch > newest {
			continue
		}
		introspect.AddCounts(out.Outcomes, s.outcomes)
		for code, n := range s.statuses {
			status := "error"
			if code != 0 {
				status = strconv.Itoa(code)
			}
			out.Statuses[status] += n
		}
		introspect.AddCounts(out.DeadLetters, s.dead)
		for b, n := range s.latency {
			out.Latency[b] += n
		}
	}
	return out
}
