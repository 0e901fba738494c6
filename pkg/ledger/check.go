package ledger

import (
	"fmt"
	"strconv"
	"time"
)

// Accepted is a request ingest answered 202 for.
type Accepted struct {
	ClientID string
	ID       string
}

// Expect is what the record is checked against.
type Expect struct {
	// Interval is the least gap allowed between two attempts of one client.
	Interval time.Duration
	// Accepted lists the accepted requests; for each client, in the order ingest accepted
	// them.
	Accepted []Accepted
	// Dead holds the ids found in the dead-letter stream.
	Dead map[string]bool
	// Replayed holds the ids an operator replayed from the dead-letter stream: a replay
	// joins the back of its client's queue, so these may arrive after later requests.
	Replayed map[string]bool
	// AllowUnacknowledged accepts arrivals of ids the test never saw accepted: when ingest
	// answered 503 because JetStream's acknowledgement did not come in time, the request
	// may still have been stored, and is then delivered (a caller would retry with the
	// same Idempotency-Key).
	AllowUnacknowledged bool
	// AttemptsOnce requires each attempt number of a request to arrive once at most: true
	// of a run in which one dispatcher held every client throughout (a new owner numbers
	// its attempts from 1 again). It catches an attempt sent twice on the wire.
	AttemptsOnce bool
	// Explained, if not nil, holds the ids whose duplicate delivery has a cause on record
	// (a dispatcher reported that the removal of the delivered request did not land, or
	// was killed while it could not have landed); a duplicate of any other id is a
	// violation.
	Explained map[string]bool
	// TimedOut holds the attempts (TimedOutKey) their sender reported timed out, having
	// had no answer: for the sender the attempt ended then, while raven, starved of CPU,
	// may write its answer after the sender gave up, so raven's end says nothing of when
	// the sender's next attempt may start. After such an attempt only the start-to-start
	// gap is checked, as after one the sender visibly hung up on (Aborted).
	TimedOut map[string]bool
	// Cancelled holds the ids a cancel was answered cancelled for, each with when that
	// cancel was asked: such a request settled without being delivered, and raven must
	// receive no attempt of it that starts from then on, nor ever accept it.
	Cancelled map[string]time.Time
}

// TimedOutKey names attempt number attempt of request id in Expect.TimedOut.
func TimedOutKey(id string, attempt int) string { return id + "/" + strconv.Itoa(attempt) }

// Report is the outcome of a Check.
type Report struct {
	Arrivals       int
	Delivered      int           // distinct ids answered 2xx
	Dead           int           // accepted ids found dead-lettered
	Duplicates     int           // 2xx answers for an id beyond its first
	DuplicateIDs   []string      // the ids delivered more than once
	Unacknowledged int           // distinct ids that arrived but were never seen accepted
	MinGap         time.Duration // least start-to-start gap between two attempts of one client; -1 if none
	Lost           int           // accepted ids neither delivered nor dead-lettered (G4)
	ShortGaps      int           // gaps between two attempts of one client below the interval (G2)
	MaxInFlight    int           // most attempts of one client that raven had in hand at once (G5: 1)
	Violations     []string      // each broken guarantee, in words (the first 50)
}

// String is a one-line summary.
func (r Report) String() string {
	return fmt.Sprintf("arrivals=%d delivered=%d dead=%d duplicates=%d unacknowledged=%d min_gap=%s lost=%d short_gaps=%d max_in_flight=%d violations=%d",
		r.Arrivals, r.Delivered, r.Dead, r.Duplicates, r.Unacknowledged, r.MinGap, r.Lost, r.ShortGaps, r.MaxInFlight, len(r.Violations))
}

// Check compares the record with e: loss (G4), order (G3), spacing (G2), and counts
// duplicates (G5).
func (l *Ledger) Check(e Expect) Report { return Check(l.Arrivals(), e) }

// Check checks arrivals recorded elsewhere (a recording raven in another process) in the
// order they arrived, as Ledger.Check does.
func Check(arrivals []Arrival, e Expect) Report {
	c := checker{e: e, rep: Report{Arrivals: len(arrivals), MinGap: -1},
		order: map[string][]string{}, index: map[string]int{}, delivered: map[string]int{}}
	for _, a := range e.Accepted {
		if _, dup := c.index[a.ID]; dup {
			continue // the same Idempotency-Key accepted twice is one request
		}
		c.index[a.ID] = len(c.order[a.ClientID])
		c.order[a.ClientID] = append(c.order[a.ClientID], a.ID)
	}
	for client, as := range c.byClient(arrivals) {
		c.rep.MaxInFlight = max(c.rep.MaxInFlight, mostAtOnce(as))
		c.client(client, as)
	}
	c.loss()
	return c.rep
}

// checker holds what Check works out on its way.
type checker struct {
	e         Expect
	rep       Report
	order     map[string][]string // client -> ids in acceptance order
	index     map[string]int      // id -> position in its client's order
	delivered map[string]int      // id -> 2xx answers
}

func (c *checker) violate(format string, args ...any) {
	if len(c.rep.Violations) < 50 {
		c.rep.Violations = append(c.rep.Violations, fmt.Sprintf(format, args...))
	}
}

// byClient groups the arrivals by client, in arrival order, checking on the way that
// each was accepted and (with AttemptsOnce) that no attempt arrived twice.
func (c *checker) byClient(arrivals []Arrival) map[string][]Arrival {
	byClient := map[string][]Arrival{}
	unknown := map[string]bool{}
	type try struct {
		id      string
		attempt int
	}
	tries := map[try]int{}
	for _, a := range arrivals {
		if c.e.AttemptsOnce && a.Attempt > 0 {
			if tries[try{a.ID, a.Attempt}]++; tries[try{a.ID, a.Attempt}] == 2 {
				c.violate("attempt %d of %s (client %q) arrived more than once: sent again without the dispatcher knowing", a.Attempt, a.ID, a.ClientID)
			}
		}
		byClient[a.ClientID] = append(byClient[a.ClientID], a)
		if _, known := c.index[a.ID]; !known && !unknown[a.ID] {
			unknown[a.ID] = true
			if !c.e.AllowUnacknowledged {
				c.violate("arrival of id %s (client %q) that was never accepted", a.ID, a.ClientID)
			}
		}
	}
	c.rep.Unacknowledged = len(unknown)
	return byClient
}

// client checks one client's arrivals: spacing (G2, G5), order (G3) and duplicates.
func (c *checker) client(client string, as []Arrival) {
	done := map[string]bool{}
	pos := 0
	for i, a := range as {
		if i > 0 {
			c.spacing(client, as[i-1], a)
		}
		k, known := c.index[a.ID]
		if !known {
			continue
		}
		if k < pos {
			if !done[a.ID] && !c.e.Replayed[a.ID] {
				c.violate("client %q: %s attempted after a later request", client, a.ID)
			}
		} else {
			for _, skipped := range c.order[client][pos:k] {
				if _, cancelled := c.e.Cancelled[skipped]; !done[skipped] && !c.e.Dead[skipped] && !c.e.Replayed[skipped] && !cancelled {
					c.violate("client %q: %s attempted before %s was delivered or dead-lettered", client, a.ID, skipped)
				}
			}
			pos = k
		}
		if at, cancelled := c.e.Cancelled[a.ID]; cancelled && !a.Start.Before(at) {
			c.violate("client %q: raven received %s at %s, after a cancel asked at %s was answered cancelled", client, a.ID, a.Start.Format(time.RFC3339Nano), at.Format(time.RFC3339Nano))
		}
		if ok(a) {
			c.deliveredOnce(client, a.ID)
			done[a.ID] = true
		}
	}
}

// spacing checks the gap between two successive attempts of one client.
func (c *checker) spacing(client string, prev, a Arrival) {
	gap := a.Start.Sub(prev.Start)
	if c.rep.MinGap < 0 || gap < c.rep.MinGap {
		c.rep.MinGap = gap
	}
	if gap < c.e.Interval {
		c.rep.ShortGaps++
		c.violate("client %q: attempts %s and %s started %s apart, below the interval %s", client, prev.ID, a.ID, gap, c.e.Interval)
	}
	// An attempt the sender hung up on, or reported timed out, ended when the sender gave
	// up; raven learns that only later, by an amount it cannot know, so after such an
	// attempt only the start-to-start gap is checked. Every other end is raven's own: its
	// answer, or the connection it dropped or reset.
	switch since := a.Start.Sub(prev.End); {
	case prev.Aborted, c.e.TimedOut[TimedOutKey(prev.ID, prev.Attempt)]:
	case since < 0:
		c.violate("client %q: attempt of %s started while attempt %d of %s was in flight (G5)", client, a.ID, prev.Attempt, prev.ID)
	case since < c.e.Interval:
		c.rep.ShortGaps++
		c.violate("client %q: attempt of %s started %s after the previous attempt ended, below the interval %s", client, a.ID, since, c.e.Interval)
	}
}

// deliveredOnce counts a 2xx answer for id, and a duplicate when it is not the first.
func (c *checker) deliveredOnce(client, id string) {
	if c.delivered[id] > 0 {
		c.rep.Duplicates++
		if c.delivered[id] == 1 {
			c.rep.DuplicateIDs = append(c.rep.DuplicateIDs, id)
			if c.e.Explained != nil && !c.e.Explained[id] {
				c.violate("client %q: %s delivered again with no removal failure on record to explain it", client, id)
			}
		}
	}
	c.delivered[id]++
}

// loss checks that every accepted request was delivered, dead-lettered or cancelled, and
// only one of those (G4).
func (c *checker) loss() {
	for _, a := range c.e.Accepted {
		switch {
		case c.delivered[a.ID] > 0 && c.e.Dead[a.ID]:
			c.violate("request %s (client %q) was both delivered and dead-lettered", a.ID, a.ClientID)
		case c.delivered[a.ID] > 0 && !c.e.Cancelled[a.ID].IsZero():
			c.violate("request %s (client %q) was accepted by raven, yet a cancel was answered cancelled", a.ID, a.ClientID)
		case c.delivered[a.ID] > 0:
		case c.e.Dead[a.ID]:
		case !c.e.Cancelled[a.ID].IsZero():
		default:
			c.rep.Lost++
			c.violate("request %s (client %q) was accepted but neither delivered nor dead-lettered", a.ID, a.ClientID)
		}
	}
	c.rep.Delivered = len(c.delivered)
	for id := range c.e.Dead {
		if _, known := c.index[id]; known {
			c.rep.Dead++
		}
	}
}

// mostAtOnce is the most of one client's arrivals (in start order) that overlap in time.
func mostAtOnce(as []Arrival) int {
	most := 0
	var ends []time.Time // ends of the arrivals still in hand
	for _, a := range as {
		kept := ends[:0]
		for _, end := range ends {
			if end.After(a.Start) {
				kept = append(kept, end)
			}
		}
		ends = append(kept, a.End)
		most = max(most, len(ends))
	}
	return most
}
