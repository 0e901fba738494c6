package admin

import (
	"context"
	"errors"
	"time"

	"github.com/penguinhq/dispatcher/pkg/queue"
)

// Status is the service on one screen: the queue's size, the dispatcher instances and
// the partitions each holds, and the NATS cluster's health.
type Status struct {
	Queue QueueSummary `json:"queue"`
	// Leases is nil when no dispatcher has used leases (LeasesNote says why).
	Leases     *queue.LeaseStatus `json:"leases,omitempty"`
	LeasesNote string             `json:"leasesNote,omitempty"`
	// NoLeases says the lease bucket does not exist: no dispatcher has run with leases
	// on this queue, as on a standalone, whose dispatcher owns every partition without
	// them (so whether it runs does not show here). For the tools' wording; LeasesNote
	// says it in the answer.
	NoLeases bool                `json:"-"`
	NATS     queue.ClusterStatus `json:"nats"`
	At       time.Time           `json:"at"`
}

// QueueSummary is how much is queued and dead.
type QueueSummary struct {
	Requests    uint64    `json:"requests"`
	Clients     uint64    `json:"clients"`
	Oldest      time.Time `json:"oldest,omitzero"`
	DeadLetters uint64    `json:"deadLetters"`
}

// Status reads the service's state. Parts that cannot be read say so in it; the error
// is for the queue itself being unreadable.
func (s *Service) Status(ctx context.Context) (Status, error) {
	out, err := s.status(ctx)
	if err != nil {
		return out, err
	}
	out.NATS, err = s.q.ClusterStatus(ctx, statusPartWait)
	return out, err
}

// status is Status without the NATS cluster's health, which takes half a second to ask
// every server.
func (s *Service) status(ctx context.Context) (Status, error) {
	out := Status{At: time.Now().UTC()}
	// Each part has its own bound: while the cluster elects a leader one part may hang,
	// and the others are what the operator needs to see then.
	part := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, statusPartWait) }
	pctx, cancel := part()
	st, err := s.q.Stats(pctx)
	cancel()
	if err != nil {
		return out, err
	}
	out.Queue = QueueSummary{Requests: st.Requests, Clients: st.Clients, Oldest: st.Oldest, DeadLetters: st.DeadLetters}
	pctx, cancel = part()
	leases, err := s.q.LeaseStatus(pctx)
	cancel()
	switch {
	case errors.Is(err, queue.ErrNoLeases):
		out.LeasesNote, out.NoLeases = err.Error(), true
	case err != nil:
		out.LeasesNote = "the lease bucket cannot be read: " + err.Error()
	default:
		out.Leases = &leases
	}
	return out, nil
}

// statusPartWait bounds each part of Status.
const statusPartWait = 5 * time.Second
