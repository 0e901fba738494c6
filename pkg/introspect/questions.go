package introspect

import (
	"encoding/json"

	"github.com/penguinhq/dispatcher/pkg/governor"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// Question is one thing operators ask every running dispatcher. Each has an answer type of
// its own, named beside it; its JSON is its body on the wire.
type Question interface {
	// Name names the question on the wire.
	Name() string
}

// LanesQuestion asks for a dispatcher's lanes of these request subjects (those it holds
// no lane for are left out), or up to Limit of its lanes (at most MaxLanes) when
// Subjects is empty. Answered by a LanesAnswer.
type LanesQuestion struct {
	Subjects []string `json:"subjects,omitempty"`
	Limit    int      `json:"limit,omitempty"`
}

// DueLanesQuestion asks for a dispatcher's waiting lanes with the earliest next send, up
// to Limit (1 to MaxDueLanes), in that order. Answered by a LanesAnswer.
type DueLanesQuestion struct {
	Limit int `json:"limit,omitempty"`
}

// DeliveredQuestion asks whether a dispatcher delivered any of these request ids
// lately. Answered by a DeliveredAnswer.
type DeliveredQuestion struct {
	IDs []string `json:"ids,omitempty"`
}

// HistoryQuestion asks for the last attempts of the clients of these request subjects,
// as a dispatcher remembers them. Answered by a HistoryAnswer.
type HistoryQuestion struct {
	Subjects []string `json:"subjects,omitempty"`
}

// BudgetQuestion asks for a dispatcher's view of raven's budget. Answered by a
// BudgetAnswer.
type BudgetQuestion struct{}

// ActivityQuestion asks for a dispatcher's last minute. Answered by an ActivityAnswer.
type ActivityQuestion struct{}

// The most lanes an answer describes: few enough that an answer fits in one NATS message
// of the server's default size (1 MiB) at the longest a lane's description can be
// (TestTheLargestLanesAnswerFitsInAMessage). An answer that does not fit cannot be sent,
// and the asker hears nothing from that dispatcher.
const (
	MaxLanes    = 1000
	MaxDueLanes = 1500
)

// The questions' names.
const (
	NameLanes     = "lanes"
	NameDueLanes  = "due"
	NameDelivered = "delivered"
	NameHistory   = "history"
	NameBudget    = "budget"
	NameActivity  = "activity"
)

func (LanesQuestion) Name() string     { return NameLanes }
func (DueLanesQuestion) Name() string  { return NameDueLanes }
func (DeliveredQuestion) Name() string { return NameDelivered }
func (HistoryQuestion) Name() string   { return NameHistory }
func (BudgetQuestion) Name() string    { return NameBudget }
func (ActivityQuestion) Name() string  { return NameActivity }

// Body is q's body on the wire.
func Body(q Question) []byte {
	b, _ := json.Marshal(q) // plain fields: it cannot fail
	return b
}

// LanesAnswer is one dispatcher's answer to LanesQuestion and to DueLanesQuestion.
type LanesAnswer struct {
	Instance string              `json:"instance"`
	Lanes    []schedule.LaneInfo `json:"lanes,omitempty"`
}

// DeliveredAnswer is one dispatcher's answer to DeliveredQuestion: the asked-for
// requests it remembers delivering.
type DeliveredAnswer struct {
	Instance  string     `json:"instance"`
	Delivered []Delivery `json:"delivered,omitempty"`
}

// HistoryAnswer is one dispatcher's answer to HistoryQuestion: the last attempts of each
// asked-for subject's client it remembers, oldest first, by subject.
type HistoryAnswer struct {
	Instance string               `json:"instance"`
	History  map[string][]Attempt `json:"history,omitempty"`
}

// BudgetAnswer is one dispatcher's answer to BudgetQuestion.
type BudgetAnswer struct {
	Instance string                `json:"instance"`
	Budget   *governor.BudgetState `json:"budget,omitempty"`
}

// ActivityAnswer is one dispatcher's answer to ActivityQuestion.
type ActivityAnswer struct {
	Instance string    `json:"instance"`
	Activity *Activity `json:"activity,omitempty"`
}
