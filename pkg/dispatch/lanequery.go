package dispatch

import (
	"context"
	"fmt"
)

type laneQuery struct {
	subjects []string
	limit    int
	reply    chan []LaneInfo
}

func (l *loop) lanesOf(q laneQuery) []LaneInfo {
	if q.subjects == nil {
		return l.sched.LaneInfos(q.limit)
	}
	var out []LaneInfo
	for _, s := range q.subjects {
		if li, ok := l.sched.Lane(s); ok {
			out = append(out, li)
		}
	}
	return out
}

// Lanes describes this instance's lanes for the given request subjects (those it holds
// no lane for are left out), or up to limit of its lanes when subjects is nil.
func (d *Dispatcher) Lanes(ctx context.Context, subjects []string, limit int) ([]LaneInfo, error) {
	q := laneQuery{subjects: subjects, limit: limit, reply: make(chan []LaneInfo, 1)}
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
	Instance  string     `json:"instance"`
	Lanes     []LaneInfo `json:"lanes,omitempty"`
	Delivered []Delivery `json:"delivered,omitempty"`
	// Budget is the instance's view of raven's budget, when asked for.
	Budget *BudgetState `json:"budget,omitempty"`
}

// AnswerLanes says which of ids this instance delivered lately, and describes its lanes
// for subjects (or up to limit of them, at most MaxLaneAnswer, when subjects and ids are
// both empty). With budget it describes its view of raven's budget instead, and its
// lanes only for subjects.
func (d *Dispatcher) AnswerLanes(ctx context.Context, ids, subjects []string, limit int, budget bool) (LaneAnswer, error) {
	a := LaneAnswer{Instance: d.cfg.InstanceID}
	if budget {
		st := d.BudgetState()
		a.Budget = &st
		if len(subjects) == 0 {
			return a, nil
		}
	}
	for _, id := range ids {
		if dl, ok := d.Delivered(id); ok {
			a.Delivered = append(a.Delivered, dl)
		}
	}
	if len(subjects) > 0 || len(ids) == 0 {
		if limit <= 0 || limit > MaxLaneAnswer {
			limit = MaxLaneAnswer
		}
		var err error
		if a.Lanes, err = d.Lanes(ctx, subjects, limit); err != nil {
			return LaneAnswer{}, err
		}
	}
	return a, nil
}
