package introspect_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/governor"
	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

var next = time.Date(2026, 12, 6, 11, 0, 0, 0, time.UTC)

// answerer answers with fixed parts and notes which it was asked for, and what.
type answerer struct{ asked []string }

func (a *answerer) Instance() string { return "d1" }

func (a *answerer) AnswerLanes(_ context.Context, q introspect.LanesQuestion) ([]schedule.LaneInfo, error) {
	a.asked = append(a.asked, fmt.Sprintf("lanes %v %d", q.Subjects, q.Limit))
	return []schedule.LaneInfo{{Subject: "s", NextSend: next}}, nil
}

func (a *answerer) AnswerDueLanes(_ context.Context, q introspect.DueLanesQuestion) ([]schedule.LaneInfo, error) {
	a.asked = append(a.asked, fmt.Sprintf("due %d", q.Limit))
	return []schedule.LaneInfo{{Subject: "due", NextSend: next}}, nil
}

func (a *answerer) AnswerDelivered(q introspect.DeliveredQuestion) []introspect.Delivery {
	a.asked = append(a.asked, fmt.Sprintf("delivered %v", q.IDs))
	return []introspect.Delivery{{ID: "r1", Delivered: next}}
}

func (a *answerer) AnswerHistory(q introspect.HistoryQuestion) map[string][]introspect.Attempt {
	a.asked = append(a.asked, fmt.Sprintf("history %v", q.Subjects))
	return map[string][]introspect.Attempt{"s": {{ID: "r1", HasGap: true}}}
}

func (a *answerer) AnswerBudget() governor.BudgetState {
	a.asked = append(a.asked, "budget")
	return governor.BudgetState{MaxRate: 7}
}

func (a *answerer) AnswerActivity() introspect.Activity {
	a.asked = append(a.asked, "activity")
	return introspect.Activity{InFlight: 3}
}

// ask asks q of a fresh answerer as a new admin does, and decodes the answer as A.
func ask[A any](t *testing.T, q introspect.Question) (A, []string, string) {
	t.Helper()
	a := &answerer{}
	b, err := introspect.Answer(context.Background(), a, q.Name(), introspect.Body(q))
	if err != nil {
		t.Fatalf("%T: %v", q, err)
	}
	var out A
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%T's answer %s: %v", q, b, err)
	}
	return out, a.asked, string(b)
}

// Each question is answered by its own method alone, with its own answer type, in
// camelCase keys (ADR 14). A question may come without a body.
func TestEachQuestionIsAnsweredByItsOwnMethod(t *testing.T) {
	lanes, asked, raw := ask[introspect.LanesAnswer](t, introspect.LanesQuestion{Subjects: []string{"s"}, Limit: 5})
	if lanes.Instance != "d1" || len(lanes.Lanes) != 1 || !lanes.Lanes[0].NextSend.Equal(next) || !slices.Equal(asked, []string{"lanes [s] 5"}) {
		t.Errorf("lanes: %+v, asked %q", lanes, asked)
	}
	if strings.Contains(raw, `"next_send"`) || !strings.Contains(raw, `"nextSend"`) {
		t.Errorf("lanes' answer %s: want nextSend alone", raw)
	}
	if out, err := introspect.Answer(context.Background(), &answerer{}, introspect.NameBudget, nil); err != nil || !strings.Contains(string(out), `"maxRate":7`) {
		t.Errorf("a budget question without a body: %s, %v", out, err)
	}
	due, asked, _ := ask[introspect.LanesAnswer](t, introspect.DueLanesQuestion{Limit: 9})
	if len(due.Lanes) != 1 || due.Lanes[0].Subject != "due" || !slices.Equal(asked, []string{"due 9"}) {
		t.Errorf("due lanes: %+v, asked %q", due, asked)
	}
	dl, asked, _ := ask[introspect.DeliveredAnswer](t, introspect.DeliveredQuestion{IDs: []string{"r1", "r2"}})
	if len(dl.Delivered) != 1 || dl.Delivered[0].ID != "r1" || !slices.Equal(asked, []string{"delivered [r1 r2]"}) {
		t.Errorf("delivered: %+v, asked %q", dl, asked)
	}
	h, asked, _ := ask[introspect.HistoryAnswer](t, introspect.HistoryQuestion{Subjects: []string{"s"}})
	if len(h.History["s"]) != 1 || !h.History["s"][0].HasGap || !slices.Equal(asked, []string{"history [s]"}) {
		t.Errorf("history: %+v, asked %q", h, asked)
	}
	b, asked, _ := ask[introspect.BudgetAnswer](t, introspect.BudgetQuestion{})
	if b.Budget == nil || b.Budget.MaxRate != 7 || !slices.Equal(asked, []string{"budget"}) {
		t.Errorf("budget: %+v, asked %q", b, asked)
	}
	act, asked, _ := ask[introspect.ActivityAnswer](t, introspect.ActivityQuestion{})
	if act.Activity == nil || act.Activity.InFlight != 3 || !slices.Equal(asked, []string{"activity"}) {
		t.Errorf("activity: %+v, asked %q", act, asked)
	}
	for _, name := range []string{"weather", ""} {
		if _, err := introspect.Answer(context.Background(), &answerer{}, name, nil); err == nil {
			t.Errorf("the question %q, which no one asks, was answered", name)
		}
	}
	for _, name := range []string{introspect.NameLanes, introspect.NameDueLanes, introspect.NameDelivered, introspect.NameHistory} {
		a := &answerer{}
		if _, err := introspect.Answer(context.Background(), a, name, []byte(`{"limit":"ten","ids":3,"subjects":4}`)); err == nil || len(a.asked) > 0 {
			t.Errorf("%s: a body that is no question was answered (asked %q): %v", name, a.asked, err)
		}
	}
}
