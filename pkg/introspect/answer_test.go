package introspect_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/governor"
	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/jsonkeys"
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
	if err := jsonkeys.Unmarshal(b, &out); err != nil {
		t.Fatalf("%T's answer %s: %v", q, b, err)
	}
	return out, a.asked, string(b)
}

// Each question is answered by its own method alone, with its own answer type, in the
// new keys alone: only an admin of this version names a question (ADR 14). A question
// may come without a body.
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
	if _, err := introspect.Answer(context.Background(), &answerer{}, "weather", nil); err == nil {
		t.Error("a question no one asks was answered")
	}
	if _, err := introspect.Answer(context.Background(), &answerer{}, introspect.NameLanes, []byte(`{"limit":"ten"}`)); err == nil {
		t.Error("a body that is no question was answered")
	}
}

// earlierQuery is the single query of the version before the questions, as its admin
// wrote it and its dispatchers read it: plain encoding/json, snake_case.
type earlierQuery struct {
	Subjects []string `json:"subjects,omitempty"`
	Limit    int      `json:"limit,omitempty"`
	IDs      []string `json:"ids,omitempty"`
	Budget   bool     `json:"budget,omitempty"`
	ByDue    bool     `json:"by_due,omitempty"`
	History  bool     `json:"history,omitempty"`
	Activity bool     `json:"activity,omitempty"`
}

// A rolling upgrade mixes versions. An admin of the earlier version sends its single
// query without a name, and is answered as that version's dispatchers answered it; a
// dispatcher of the earlier version reads each question's body as the query that asks
// the same; and an earlier dispatcher's combined answer reads as each question's answer.
func TestQuestionsAndTheEarlierQueryAnswerEachOther(t *testing.T) {
	for _, c := range []struct {
		query earlierQuery
		asked []string
		parts []string
	}{
		// What the earlier admin asked, and two edges of its rules.
		{earlierQuery{Subjects: []string{"s"}, History: true}, []string{"delivered []", "lanes [s] 0", "history [s]"}, []string{"delivered", "history", "lanes"}},
		{earlierQuery{Activity: true, Budget: true}, []string{"budget", "activity"}, []string{"activity", "budget"}},
		{earlierQuery{IDs: []string{"r1"}}, []string{"delivered [r1]"}, []string{"delivered"}},
		{earlierQuery{Subjects: []string{"s"}}, []string{"delivered []", "lanes [s] 0"}, []string{"delivered", "lanes"}},
		{earlierQuery{ByDue: true, Limit: 4}, []string{"due 4"}, []string{"lanes"}},
		{earlierQuery{Budget: true}, []string{"budget"}, []string{"budget"}},
		{earlierQuery{Budget: true, Subjects: []string{"s"}, IDs: []string{"r1"}}, []string{"budget", "delivered [r1]", "lanes [s] 0"}, []string{"budget", "delivered", "lanes"}},
		{earlierQuery{Limit: 3}, []string{"delivered []", "lanes [] 3"}, []string{"delivered", "lanes"}},
		{earlierQuery{Activity: true}, []string{"activity"}, []string{"activity"}},
	} {
		body, _ := json.Marshal(c.query)
		a := &answerer{}
		out, err := introspect.Answer(context.Background(), a, "", body)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if strings.Contains(string(out), `"nextSend"`) && !strings.Contains(string(out), `"next_send"`) {
			t.Errorf("%s: the answer %s has no next_send for the earlier admin", body, out)
		}
		var parts map[string]json.RawMessage
		if err := json.Unmarshal(out, &parts); err != nil {
			t.Fatal(err)
		}
		delete(parts, "instance")
		keys := slices.Sorted(func(yield func(string) bool) {
			for k := range parts {
				if !yield(k) {
					return
				}
			}
		})
		if !slices.Equal(a.asked, c.asked) || !slices.Equal(keys, c.parts) {
			t.Errorf("%s: asked %q, answered %q; want %q, %q", body, a.asked, keys, c.asked, c.parts)
		}
	}

	// Each question's body, as an earlier dispatcher reads it.
	for _, c := range []struct {
		q    introspect.Question
		want earlierQuery
	}{
		{introspect.LanesQuestion{Subjects: []string{"s"}, Limit: 2}, earlierQuery{Subjects: []string{"s"}, Limit: 2}},
		{introspect.DueLanesQuestion{Limit: 4}, earlierQuery{ByDue: true, Limit: 4}},
		{introspect.DeliveredQuestion{IDs: []string{"r1"}}, earlierQuery{IDs: []string{"r1"}}},
		{introspect.HistoryQuestion{Subjects: []string{"s"}}, earlierQuery{Subjects: []string{"s"}, History: true}},
		{introspect.BudgetQuestion{}, earlierQuery{Budget: true}},
		{introspect.ActivityQuestion{}, earlierQuery{Activity: true}},
	} {
		var got earlierQuery
		if err := json.Unmarshal(introspect.Body(c.q), &got); err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%T's body %s reads as %+v to an earlier dispatcher; want %+v", c.q, introspect.Body(c.q), got, c.want)
		}
	}

	// An earlier dispatcher's answer (snake_case, every part it was asked for), as each
	// question's answer.
	earlier := []byte(`{"instance":"d0","lanes":[{"subject":"s","state":"waiting","next_send":"2026-12-06T11:00:00Z","attempts":0,"interval":0}],
		"delivered":[{"id":"r1","subject":"s","attempt":1,"delivered_at":"2026-12-06T11:00:00Z"}],
		"budget":{"max_rate":7,"max_inflight":2,"adaptive":false,"owned":1,"partitions":1,"share_rate":7,"share_inflight":2,"effective_rate":7,"why":"","waiting":0,"in_flight":1},
		"history":{"s":[{"id":"r1","attempt":1,"start":"2026-12-06T11:00:00Z","end":"2026-12-06T11:00:00Z","gap":0,"has_gap":true,"interval":0,"outcome":"delivered"}]},
		"activity":{"window":60000000000,"outcomes":{},"statuses":{},"latency":[],"dead_letters":{"permanent":1},"in_flight":2,"lanes":1,"owned":1}}`)
	var lanes introspect.LanesAnswer
	var dl introspect.DeliveredAnswer
	var b introspect.BudgetAnswer
	var h introspect.HistoryAnswer
	var act introspect.ActivityAnswer
	for _, v := range []any{&lanes, &dl, &b, &h, &act} {
		if err := jsonkeys.Unmarshal(earlier, v); err != nil {
			t.Fatalf("%T: %v", v, err)
		}
	}
	if lanes.Instance != "d0" || len(lanes.Lanes) != 1 || !lanes.Lanes[0].NextSend.Equal(next) ||
		len(dl.Delivered) != 1 || !dl.Delivered[0].Delivered.Equal(next) ||
		b.Budget == nil || b.Budget.MaxInFlight != 2 || b.Budget.InFlight != 1 ||
		len(h.History["s"]) != 1 || !h.History["s"][0].HasGap ||
		act.Activity == nil || act.Activity.InFlight != 2 || act.Activity.DeadLetters["permanent"] != 1 {
		t.Errorf("an earlier answer read as %+v %+v %+v %+v %+v", lanes, dl, b.Budget, h, act.Activity)
	}
}
