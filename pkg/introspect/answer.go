package introspect

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/penguinhq/dispatcher/pkg/governor"
	"github.com/penguinhq/dispatcher/pkg/jsonkeys"
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
// a: the answer's JSON. An empty name is the earlier single query, answered as before,
// with each renamed key under its old name as well (ADR 14) for the admin that asked it;
// a named question comes from an admin of this version or later, which reads the new
// keys, and its answer carries those alone (a lane's old keys would make a long due-lanes
// answer half as long again, and NATS caps a message's size).
func Answer(ctx context.Context, a Answerer, name string, body []byte) ([]byte, error) {
	var q query
	if len(body) > 0 || name == "" {
		if err := jsonkeys.Unmarshal(body, &q); err != nil {
			return nil, fmt.Errorf("question %q: %w", name, err)
		}
	}
	if name == "" {
		out, err := answerEarlier(ctx, a, q)
		if err != nil {
			return nil, err
		}
		return jsonkeys.Marshal(out)
	}
	out, err := answer(ctx, a, name, q)
	if err != nil {
		return nil, err
	}
	return json.Marshal(out)
}

func answer(ctx context.Context, a Answerer, name string, q query) (any, error) {
	id := a.Instance()
	switch name {
	case NameLanes:
		lanes, err := a.AnswerLanes(ctx, LanesQuestion{Subjects: q.Subjects, Limit: q.Limit})
		return LanesAnswer{Instance: id, Lanes: lanes}, err
	case NameDueLanes:
		lanes, err := a.AnswerDueLanes(ctx, DueLanesQuestion{Limit: q.Limit})
		return LanesAnswer{Instance: id, Lanes: lanes}, err
	case NameDelivered:
		return DeliveredAnswer{Instance: id, Delivered: a.AnswerDelivered(DeliveredQuestion{IDs: q.IDs})}, nil
	case NameHistory:
		return HistoryAnswer{Instance: id, History: a.AnswerHistory(HistoryQuestion{Subjects: q.Subjects})}, nil
	case NameBudget:
		st := a.AnswerBudget()
		return BudgetAnswer{Instance: id, Budget: &st}, nil
	case NameActivity:
		act := a.AnswerActivity()
		return ActivityAnswer{Instance: id, Activity: &act}, nil
	}
	return nil, fmt.Errorf("no question is named %q", name)
}

// earlierAnswer is the answer to the earlier single query: every part it asked for.
type earlierAnswer struct {
	Instance  string                `json:"instance"`
	Lanes     []schedule.LaneInfo   `json:"lanes,omitempty"`
	Delivered []Delivery            `json:"delivered,omitempty"`
	Budget    *governor.BudgetState `json:"budget,omitempty"`
	History   map[string][]Attempt  `json:"history,omitempty"`
	Activity  *Activity             `json:"activity,omitempty"`
}

// answerEarlier answers an admin of the version before the questions, as that version's
// dispatchers did. ByDue is answered alone. Otherwise, unless it asks for Activity alone:
// the budget when asked for, and then (without the budget, or with Subjects) the
// delivered ids and the lanes of Subjects, or up to Limit lanes when it names neither
// subjects nor ids. Then History and Activity when asked for.
func answerEarlier(ctx context.Context, a Answerer, q query) (earlierAnswer, error) {
	out := earlierAnswer{Instance: a.Instance()}
	if q.ByDue {
		var err error
		out.Lanes, err = a.AnswerDueLanes(ctx, DueLanesQuestion{Limit: q.Limit})
		return out, err
	}
	if !q.Activity || q.Budget || len(q.Subjects) > 0 || len(q.IDs) > 0 {
		if q.Budget {
			st := a.AnswerBudget()
			out.Budget = &st
		}
		if !q.Budget || len(q.Subjects) > 0 {
			out.Delivered = a.AnswerDelivered(DeliveredQuestion{IDs: q.IDs})
			if len(q.Subjects) > 0 || len(q.IDs) == 0 {
				var err error
				if out.Lanes, err = a.AnswerLanes(ctx, LanesQuestion{Subjects: q.Subjects, Limit: q.Limit}); err != nil {
					return earlierAnswer{}, err
				}
			}
		}
	}
	if q.History {
		out.History = a.AnswerHistory(HistoryQuestion{Subjects: q.Subjects})
	}
	if q.Activity {
		act := a.AnswerActivity()
		out.Activity = &act
	}
	return out, nil
}

// AnswersOf is Answer for a: what pkg/queue's ServeQuestions takes.
func AnswersOf(a Answerer) func(ctx context.Context, name string, body []byte) ([]byte, error) {
	return func(ctx context.Context, name string, body []byte) ([]byte, error) {
		return Answer(ctx, a, name, body)
	}
}
