package request

import "time"

// Queued is what a dispatcher tells of a request it found queued (a queued request's
// lookup, a cancel's answer): what its status says of it, without its body.
type Queued struct {
	AcceptedAt time.Time `json:"acceptedAt,omitzero"`
	NotBefore  time.Time `json:"notBefore,omitzero"`
	NotAfter   time.Time `json:"notAfter,omitzero"`
	Cycle      int       `json:"cycle,omitempty"`
}

// QueuedOf is what st's status says of it while queued.
func QueuedOf(st Stored) Queued {
	return Queued{AcceptedAt: st.AcceptedAt, NotBefore: st.NotBefore, NotAfter: st.NotAfter, Cycle: st.Cycle}
}

// Status is the status of request id of clientID in state, from what q tells of it.
func (q Queued) Status(clientID, id string, state State) Status {
	return Status{ID: id, ClientID: clientID, State: state, AcceptedAt: q.AcceptedAt, NotBefore: q.NotBefore,
		NotAfter: q.NotAfter, Replays: q.Cycle}
}
