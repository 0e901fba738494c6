package dispatch

import (
	"context"
	"fmt"

	"github.com/penguinhq/dispatcher/pkg/governor"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

type laneQuery struct {
	lanes []request.Lane
	limit int
	byDue bool
	reply chan []schedule.LaneInfo
}

func (l *loop) lanesOf(q laneQuery) []schedule.LaneInfo {
	if q.byDue {
		return l.sched.DueLanes(q.limit)
	}
	if q.lanes == nil {
		return l.sched.LaneInfos(q.limit)
	}
	var out []schedule.LaneInfo
	for _, lane := range q.lanes {
		if li, ok := l.sched.Lane(lane); ok {
			out = append(out, li)
		}
	}
	return out
}

// Lanes describes this instance's lanes of the given lanes (those it holds no lane for
// are left out), or up to limit of its lanes when lanes is nil.
func (d *Dispatcher) Lanes(ctx context.Context, lanes []request.Lane, limit int) ([]schedule.LaneInfo, error) {
	return d.askLoop(ctx, laneQuery{lanes: lanes, limit: limit})
}

// lanesOf are the lanes of a query's request subjects (the asks' wire carries subjects),
// nil for nil, one for each subject: a subject that names no lane becomes a lane that is
// nowhere (partition -1), described as none, so that the answer is as for any subject
// this instance holds no lane for.
func lanesOf(subjects []string) []request.Lane {
	if subjects == nil {
		return nil
	}
	lanes := make([]request.Lane, len(subjects))
	for i, s := range subjects {
		lane, err := request.LaneOf(s)
		if err != nil {
			lane = request.Lane{Partition: -1, Token: s}
		}
		lanes[i] = lane
	}
	return lanes
}

func (d *Dispatcher) askLoop(ctx context.Context, q laneQuery) ([]schedule.LaneInfo, error) {
	q.reply = make(chan []schedule.LaneInfo, 1)
	select {
	case d.queries <- q:
	case <-ctx.Done():
		return nil, fmt.Errorf("dispatcher did not answer: %w", ctx.Err())
	}
	select {
	case out := <-q.reply:
		return out, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("dispatcher did not answer: %w", ctx.Err())
	}
}

// MaxLaneAnswer is the most lanes one answer describes.
const MaxLaneAnswer = 1000

// LaneAnswer is one instance's answer to operators asking about lanes and requests.
type LaneAnswer struct {
	Instance  string              `json:"instance"`
	Lanes     []schedule.LaneInfo `json:"lanes,omitempty"`
	Delivered []Delivery          `json:"delivered,omitempty"`
	// Budget is the instance's view of raven's budget, when asked for.
	Budget *governor.BudgetState `json:"budget,omitempty"`
	// History is the last attempts of each asked-for subject's client this instance
	// remembers, oldest first, when asked for.
	History map[string][]Attempt `json:"history,omitempty"`
	// Activity is the instance's last minute, when asked for.
	Activity *Activity `json:"activity,omitempty"`
}

// Answer answers a lane query: AnswerLanes's answer, with the lanes by due, the clients'
// histories and the instance's activity when asked for.
func (d *Dispatcher) Answer(ctx context.Context, q request.LaneQuery) (LaneAnswer, error) {
	if q.ByDue {
		lanes, err := d.askLoop(ctx, laneQuery{limit: min(max(q.Limit, 1), MaxDueLanes), byDue: true})
		return LaneAnswer{Instance: d.cfg.InstanceID, Lanes: lanes}, err
	}
	a := LaneAnswer{Instance: d.cfg.InstanceID}
	lanes := lanesOf(q.Subjects)
	if !q.Activity || q.Budget || len(q.Subjects) > 0 || len(q.IDs) > 0 {
		var err error
		if a, err = d.AnswerLanes(ctx, q.IDs, lanes, q.Limit, q.Budget); err != nil {
			return a, err
		}
	}
	if q.History {
		a.History = map[string][]Attempt{}
		for _, lane := range lanes {
			if h := d.activity.history(lane); len(h) > 0 {
				for i := range h {
					h[i].Instance = d.cfg.InstanceID
				}
				a.History[lane.Subject()] = h
			}
		}
	}
	if q.Activity {
		act := d.activity.window(d.now())
		st := d.Stats()
		act.InFlight, act.Lanes, act.Owned = st.InFlight, st.Lanes, st.Owned
		a.Activity = &act
	}
	return a, nil
}

// MaxDueLanes is the most lanes an Ask ByDue is answered with.
const MaxDueLanes = 10_000

// AnswerLanes says which of ids this instance delivered lately, and describes its lanes
// of lanes (or up to limit of them, at most MaxLaneAnswer, when lanes and ids are both
// empty). With budget it describes its view of raven's budget instead, and its lanes
// only of lanes.
func (d *Dispatcher) AnswerLanes(ctx context.Context, ids []string, lanes []request.Lane, limit int, budget bool) (LaneAnswer, error) {
	a := LaneAnswer{Instance: d.cfg.InstanceID}
	if budget {
		st := d.BudgetState()
		a.Budget = &st
		if len(lanes) == 0 {
			return a, nil
		}
	}
	for _, id := range ids {
		if dl, ok := d.Delivered(id); ok {
			a.Delivered = append(a.Delivered, dl)
		}
	}
	if len(lanes) > 0 || len(ids) == 0 {
		if limit <= 0 || limit > MaxLaneAnswer {
			limit = MaxLaneAnswer
		}
		var err error
		if a.Lanes, err = d.Lanes(ctx, lanes, limit); err != nil {
			return LaneAnswer{}, err
		}
		for i := range a.Lanes {
			a.Lanes[i].LastDelivered = d.activity.lastDelivered(a.Lanes[i].Lane)
		}
	}
	return a, nil
}
