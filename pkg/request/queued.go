package request

import "time"

// Queued is what a dispatcher tells of a request it found queued (a queued request's
// lookup, a cancel's answer): what its status says of it, without its body.
type Queued struct {
	AcceptedAt time.Time `json:"acceptedAt,omitzero"`
	NotBefore  time.Time `json:"notBefore,omitzero"`
	NotAfter   time.Time `json:"notAfter,omitzero"`
	Cycle      int       `json:"cycle,omitempty"`
	// BodyDigest is the stored request's (Request.BodyDigest): ingest compares a key sent
	// again with it before the accepted event that carries it is written.
	BodyDigest string `json:"bodyDigest,omitempty"`
}

// QueuedOf is what st's status says of it while queued.
func QueuedOf(st Stored) Queued {
	return Queued{AcceptedAt: st.AcceptedAt, NotBefore: st.NotBefore, NotAfter: st.NotAfter, Cycle: st.Cycle, BodyDigest: st.BodyDigest}
}

// Found is a request a dispatcher found queued: what it tells, and the request's
// sequence in the queue.
type Found struct {
	Queued
	Seq uint64
	// Kept are the final events of a request found not queued that the request stream
	// keeps until the events stream takes them (ADR 9): its outcome, before its record
	// says it.
	Kept []Event
}

// Status is the found request's status: queued since it was stored.
func (f Found) Status(clientID, id string) Status {
	st := f.Queued.Status(clientID, id, StateQueued)
	st.UpdatedAt, st.Seq = f.AcceptedAt, f.Seq
	return st
}

// Status is the status of request id of clientID in state, from what q tells of it.
func (q Queued) Status(clientID, id string, state State) Status {
	return Status{ID: id, ClientID: clientID, State: state, AcceptedAt: q.AcceptedAt, NotBefore: q.NotBefore,
		NotAfter: q.NotAfter, Replays: q.Cycle}
}
