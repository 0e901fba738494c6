package introspect

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/penguinhq/dispatcher/pkg/governor"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// Answerer is what a dispatcher answers each question with (pkg/dispatch's Dispatcher).
type Answerer interface {
	// Instance names the dispatcher in every answer.
	Instance() string
	AnswerLanes(ctx context.Context, q LanesQuestion) ([]schedule.LaneInfo, error)
	AnswerDueLanes(ctx context.Context, q DueLanesQuestion) ([]schedule.LaneInfo, error)
	AnswerDelivered(q DeliveredQuestion) []Delivery
	AnswerHistory(q HistoryQuestion) map[string][]Attempt
	AnswerBudget() governor.BudgetState
	AnswerActivity() Activity
}

// Answer answers the question named name, with body as its body (empty for none), from
// a: the answer's JSON.
func Answer(ctx context.Context, a Answerer, name string, body []byte) ([]byte, error) {
	out, err := answer(ctx, a, name, body)
	if err != nil {
		return nil, err
	}
	return json.Marshal(out)
}

func answer(ctx context.Context, a Answerer, name string, body []byte) (any, error) {
	id := a.Instance()
	switch name {
	case NameLanes:
		q, err := read[LanesQuestion](name, body)
		if err != nil {
			return nil, err
		}
		lanes, err := a.AnswerLanes(ctx, q)
		return LanesAnswer{Instance: id, Lanes: lanes}, err
	case NameDueLanes:
		q, err := read[DueLanesQuestion](name, body)
		if err != nil {
			return nil, err
		}
		lanes, err := a.AnswerDueLanes(ctx, q)
		return LanesAnswer{Instance: id, Lanes: lanes}, err
	case NameDelivered:
		q, err := read[DeliveredQuestion](name, body)
		if err != nil {
			return nil, err
		}
		return DeliveredAnswer{Instance: id, Delivered: a.AnswerDelivered(q)}, nil
	case NameHistory:
		q, err := read[HistoryQuestion](name, body)
		if err != nil {
			return nil, err
		}
		return HistoryAnswer{Instance: id, History: a.AnswerHistory(q)}, nil
	case NameBudget:
		st := a.AnswerBudget()
		return BudgetAnswer{Instance: id, Budget: &st}, nil
	case NameActivity:
		act := a.AnswerActivity()
		return ActivityAnswer{Instance: id, Activity: &act}, nil
	}
	return nil, fmt.Errorf("no question is named %q", name)
}

// read is the question Q that body holds; an empty body is Q's zero value.
func read[Q any](name string, body []byte) (Q, error) {
	var q Q
	if len(body) == 0 {
		return q, nil
	}
	if err := json.Unmarshal(body, &q); err != nil {
		return q, fmt.Errorf("question %q: %w", name, err)
	}
	return q, nil
}

// AnswersOf is Answer for a: what pkg/queue's ServeQuestions takes.
func AnswersOf(a Answerer) func(ctx context.Context, name string, body []byte) ([]byte, error) {
	return func(ctx context.Context, name string, body []byte) ([]byte, error) {
		return Answer(ctx, a, name, body)
	}
}
