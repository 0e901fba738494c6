package introspect

import (
	"time"

	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// The parts of the answers that describe what an instance did lately: its memory of
// clients' attempts, of its last minute and of its deliveries (kept by pkg/dispatch,
// bounded, not durable).

// Attempt is one attempt as the console shows it.
type Attempt struct {
	ID      string    `json:"id"`
	Attempt int       `json:"attempt"`
	Start   time.Time `json:"start"`
	End     time.Time `json:"end"`
	// Gap is the time from the end of the client's previous attempt (by this instance's
	// clock, or the fence an earlier owner left) to the start of this one; HasGap is false
	// for a client's first attempt.
	Gap      time.Duration    `json:"gap"`
	HasGap   bool             `json:"hasGap"`
	Interval time.Duration    `json:"interval"` // in force for the client at the attempt
	Outcome  schedule.Outcome `json:"outcome"`
	Status   int              `json:"status,omitempty"` // raven's HTTP status; 0 when it gave none
	Instance string           `json:"instance,omitempty"`
}

// Activity is one instance's last ActivityWindow: attempts by outcome, raven's answers by
// status ("error" when there was none) and by latency (counts per LatencyBounds bucket,
// the last bucket open-ended), and dead letters by reason.
type Activity struct {
	// Window is how long the counts cover: from ActivityWindow less one slot (5 s) to
	// ActivityWindow, as the newest slot fills. Rates divide by it.
	Window      time.Duration            `json:"window"`
	Outcomes    map[schedule.Outcome]int `json:"outcomes"`
	Statuses    map[string]int           `json:"statuses"`
	Latency     []int                    `json:"latency"`
	DeadLetters map[string]int           `json:"deadLetters"`
	InFlight    int                      `json:"inFlight"`
	Lanes       int                      `json:"lanes"`
	Owned       int                      `json:"owned"`
}

// ActivityWindow is how far back Activity reaches.
const ActivityWindow = time.Minute

// LatencyBounds are the upper bounds of Activity.Latency's buckets; one more bucket holds
// the slower answers.
var LatencyBounds = []time.Duration{
	time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond,
	25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond,
	500 * time.Millisecond, time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
}

// Delivery is what an instance remembers of a request raven accepted.
type Delivery struct {
	ID        string    `json:"id"`
	Subject   string    `json:"subject"`
	Attempt   int       `json:"attempt"`
	Delivered time.Time `json:"deliveredAt"`
}

// AddCounts adds from's counts to to's.
func AddCounts[K comparable](to, from map[K]int) {
	for k, n := range from {
		to[k] += n
	}
}

// Merge adds o's counts to a (instances' activities, for the whole service).
func (a *Activity) Merge(o Activity) {
	if a.Outcomes == nil {
		*a = Activity{Window: o.Window, Outcomes: map[schedule.Outcome]int{}, Statuses: map[string]int{}, Latency: make([]int, len(LatencyBounds)+1), DeadLetters: map[string]int{}}
	}
	AddCounts(a.Outcomes, o.Outcomes)
	AddCounts(a.Statuses, o.Statuses)
	AddCounts(a.DeadLetters, o.DeadLetters)
	for b := range min(len(a.Latency), len(o.Latency)) {
		a.Latency[b] += o.Latency[b]
	}
	a.Window = max(a.Window, o.Window)
	a.InFlight += o.InFlight
	a.Lanes += o.Lanes
	a.Owned += o.Owned
}

// Quantile is the upper bound of the latency bucket that holds the q-th quantile of the
// answers (q in (0, 1]); 0 when there were none, and -1 when it is past the last bound.
func (a Activity) Quantile(q float64) time.Duration {
	total := 0
	for _, n := range a.Latency {
		total += n
	}
	if total == 0 {
		return 0
	}
	rank := int(q*float64(total) + 0.999999)
	seen := 0
	for b, n := range a.Latency {
		seen += n
		if seen >= rank {
			if b < len(LatencyBounds) {
				return LatencyBounds[b]
			}
			return -1
		}
	}
	return -1
}

// Of is how many attempts came to any of outcomes.
func (a Activity) Of(outcomes ...schedule.Outcome) int {
	n := 0
	for _, o := range outcomes {
		n += a.Outcomes[o]
	}
	return n
}
