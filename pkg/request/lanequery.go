package request

// LaneQuery is what operators ask the running dispatchers about their lanes (core NATS
// request/reply on dispatch.ctl.lanes; every dispatcher answers for itself): its lanes for
// the given request subjects, or up to Limit of its lanes when Subjects and IDs are both
// empty, and whether it delivered any of the request IDs lately; with Budget, about
// raven's budget instead.
type LaneQuery struct {
	Subjects []string `json:"subjects,omitempty"`
	Limit    int      `json:"limit,omitempty"`
	IDs      []string `json:"ids,omitempty"`
	Budget   bool     `json:"budget,omitempty"`
	// ByDue asks for the waiting lanes with the earliest next send, up to Limit, in that
	// order.
	ByDue bool `json:"byDue,omitempty" was:"by_due"`
	// History asks for the last attempts of Subjects' clients.
	History bool `json:"history,omitempty"`
	// Activity asks for each instance's last minute.
	Activity bool `json:"activity,omitempty"`
}
