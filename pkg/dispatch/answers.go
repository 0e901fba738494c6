package dispatch

import (
	"context"
	"fmt"

	"github.com/penguinhq/dispatcher/pkg/governor"
	"github.com/penguinhq/dispatcher/pkg/introspect"
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

// lanesOf are the lanes a question's request subjects name (the wire carries subjects).
// A subject that names no lane is left out: no instance holds a lane for it, so it is
// answered as any subject this one holds no lane for.
func lanesOf(subjects []string) []request.Lane {
	lanes := make([]request.Lane, 0, len(subjects))
	for _, s := range subjects {
		if lane, err := request.LaneOf(s); err == nil {
			lanes = append(lanes, lane)
		}
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

// What operators ask a dispatcher (pkg/introspect's questions): the Dispatcher is an
// introspect.Answerer.

// Instance names this dispatcher.
func (d *Dispatcher) Instance() string { return d.cfg.InstanceID }

// AnswerLanes describes this instance's lanes of q's subjects, with when each client's
// last delivery ended, or up to q.Limit of its lanes (at most introspect.MaxLanes) when
// q names no subject.
func (d *Dispatcher) AnswerLanes(ctx context.Context, q introspect.LanesQuestion) ([]schedule.LaneInfo, error) {
	limit := q.Limit
	if limit <= 0 || limit > introspect.MaxLanes {
		limit = introspect.MaxLanes
	}
	var of []request.Lane // none: every lane, up to limit
	if len(q.Subjects) > 0 {
		if of = lanesOf(q.Subjects); len(of) == 0 {
			return nil, nil // none names a lane
		}
	}
	lanes, err := d.Lanes(ctx, of, limit)
	if err != nil {
		return nil, err
	}
	for i := range lanes {
		lanes[i].LastDelivered = d.activity.lastDelivered(lanes[i].Lane)
	}
	return lanes, nil
}

// AnswerDueLanes describes this instance's waiting lanes with the earliest next send, up
// to q.Limit (1 to introspect.MaxDueLanes), in that order.
func (d *Dispatcher) AnswerDueLanes(ctx context.Context, q introspect.DueLanesQuestion) ([]schedule.LaneInfo, error) {
	return d.askLoop(ctx, laneQuery{limit: min(max(q.Limit, 1), introspect.MaxDueLanes), byDue: true})
}

// AnswerDelivered is what this instance remembers delivering of q's ids.
func (d *Dispatcher) AnswerDelivered(q introspect.DeliveredQuestion) []introspect.Delivery {
	var out []introspect.Delivery
	for _, id := range q.IDs {
		if dl, ok := d.Delivered(id); ok {
			out = append(out, dl)
		}
	}
	return out
}

// AnswerHistory is the last attempts of q's subjects' clients this instance remembers,
// oldest first, by subject.
func (d *Dispatcher) AnswerHistory(q introspect.HistoryQuestion) map[string][]introspect.Attempt {
	out := map[string][]introspect.Attempt{}
	for _, lane := range lanesOf(q.Subjects) {
		if h := d.activity.history(lane); len(h) > 0 {
			for i := range h {
				h[i].Instance = d.cfg.InstanceID
			}
			out[lane.Subject()] = h
		}
	}
	return out
}

// AnswerBudget is this instance's view of raven's budget.
func (d *Dispatcher) AnswerBudget() governor.BudgetState { return d.BudgetState() }

// AnswerActivity is this instance's last minute.
func (d *Dispatcher) AnswerActivity() introspect.Activity {
	act := d.activity.window(d.now())
	st := d.Stats()
	act.InFlight, act.Lanes, act.Owned = st.InFlight, st.Lanes, st.Owned
	return act
}
