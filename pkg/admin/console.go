package admin

import (
	"cmp"
	"context"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// What the operators' console reads beyond the admin API's calls: one client on one
// screen, and the service's last minute.

// MaxQueuedShown is how many of a client's queued requests ClientView lists.
const MaxQueuedShown = 50

// ClientView is one client on one screen.
type ClientView struct {
	Client
	// Queued are its first MaxQueuedShown queued requests, in the order they will go.
	Queued []QueuedRequest `json:"queued"`
	// History is its last attempts, oldest first, as the dispatchers remember them.
	History []introspect.Attempt `json:"history"`
	// DeadLetters are its first dead letters, oldest first, of DeadTotal.
	DeadLetters []request.DeadLetter `json:"deadLetters"`
	DeadTotal   int                  `json:"deadTotal"`
	// LastSeq is the sequence of its newest queued request when this was read (0: none):
	// a purge confirmed from this view goes no further (PurgeThrough).
	LastSeq uint64 `json:"lastSeq,omitempty"`
}

// QueuedRequest is one queued request, without its body.
type QueuedRequest struct {
	ID         string    `json:"id"`
	Seq        uint64    `json:"seq"`
	AcceptedAt time.Time `json:"acceptedAt"`
	NotBefore  time.Time `json:"notBefore,omitzero"`
}

// LastDelivery is the end of the client's last delivered attempt that History holds.
func (v ClientView) LastDelivery() (introspect.Attempt, bool) {
	for i := len(v.History) - 1; i >= 0; i-- {
		if v.History[i].Outcome == schedule.OutcomeDelivered {
			return v.History[i], true
		}
	}
	return introspect.Attempt{}, false
}

// Client describes one client, with or without a backlog: its lane, steering, queued
// requests, last attempts and dead letters.
func (s *Service) Client(ctx context.Context, clientID string) (ClientView, error) {
	if err := request.ValidateClientID(clientID); err != nil {
		return ClientView{}, invalid("client: %s", err)
	}
	lane, n, ok, err := s.q.ClientLane(ctx, clientID)
	if err != nil {
		return ClientView{}, err
	}
	subject := lane.Subject()
	if !ok {
		subject = s.q.StoredSubject(clientID)
	}
	v := ClientView{Client: Client{ClientID: clientID, Backlog: n, subject: subject, oldestKnown: !ok}}
	if ok {
		if v.LastSeq, err = s.q.LastSeq(ctx, subject); err != nil {
			return v, err
		}
	}
	cs := []Client{v.Client}
	s.heads(ctx, cs)
	s.describe(ctx, cs)
	v.Client = cs[0]
	queued, err := s.q.Queued(ctx, clientID, MaxQueuedShown)
	if err != nil {
		return v, err
	}
	v.Queued = make([]QueuedRequest, len(queued))
	for i, st := range queued {
		v.Queued[i] = QueuedRequest{ID: st.ID, Seq: st.Seq, AcceptedAt: st.AcceptedAt, NotBefore: st.NotBefore}
	}
	for _, a := range ask[introspect.HistoryAnswer](ctx, s, introspect.HistoryQuestion{Subjects: []string{subject}}) {
		v.History = append(v.History, a.History[subject]...)
	}
	// Two instances remember attempts when the client moved between them: in time order.
	sort.SliceStable(v.History, func(i, j int) bool { return v.History[i].Start.Before(v.History[j].Start) })
	v.DeadLetters, v.DeadTotal, err = s.DeadLetters(ctx, queue.DeadFilter{ClientID: clientID}, 20)
	return v, err
}

// Overview is the service's last minute on one screen.
type Overview struct {
	// Status is without the NATS cluster's health (dispatchctl status has it).
	Status Status `json:"status"`
	// Activity is every answering dispatcher's last minute, added up; Instances each one's.
	Activity  introspect.Activity `json:"activity"`
	Instances []InstanceActivity  `json:"instances"`
	// Budget is raven's budget; nil when it cannot be read.
	Budget *BudgetView `json:"budget,omitempty"`
	// Problems are the parts that could not be read, for the page to say so.
	Problems []string  `json:"problems,omitempty"`
	At       time.Time `json:"at"`
}

// InstanceActivity is one dispatcher's last minute.
type InstanceActivity struct {
	Instance string `json:"instance"`
	introspect.Activity
}

// SendsPerSecond is the deliveries per second over the window.
func (o Overview) SendsPerSecond() float64 {
	if o.Activity.Window <= 0 {
		return 0
	}
	return float64(o.Activity.Outcomes[schedule.OutcomeDelivered]) / o.Activity.Window.Seconds()
}

// Overview reads the service's state and every dispatcher's last minute. Parts that
// cannot be read are named in Problems; the page shows the rest.
func (s *Service) Overview(ctx context.Context) Overview {
	o := Overview{At: time.Now().UTC()}
	var wg sync.WaitGroup
	var stErr error
	wg.Go(func() { o.Status, stErr = s.status(ctx) })
	var b BudgetView
	var bErr error
	wg.Go(func() { b, bErr = s.Budget(ctx) })
	answers := ask[introspect.ActivityAnswer](ctx, s, introspect.ActivityQuestion{})
	wg.Wait()
	for _, a := range answers {
		if a.Activity == nil {
			continue
		}
		o.Instances = append(o.Instances, InstanceActivity{Instance: a.Instance, Activity: *a.Activity})
		o.Activity.Merge(*a.Activity)
	}
	if o.Activity.Outcomes == nil {
		o.Activity.Merge(introspect.Activity{Window: introspect.ActivityWindow})
	}
	slices.SortFunc(o.Instances, func(a, b InstanceActivity) int { return cmp.Compare(a.Instance, b.Instance) })
	if stErr != nil {
		o.Problems = append(o.Problems, "status: "+stErr.Error())
	}
	if bErr != nil {
		o.Problems = append(o.Problems, "raven's budget: "+bErr.Error())
	} else {
		o.Budget = &b
	}
	if len(answers) == 0 {
		o.Problems = append(o.Problems, "no dispatcher answered within "+s.laneWait.String())
	}
	o.Problems = append(o.Problems, s.Unanswered()...)
	return o
}

// Events is the recorded events of request id of client clientID (its timeline), in the
// order they were stored.
func (s *Service) Events(ctx context.Context, clientID, id string) ([]request.Event, error) {
	if err := request.ValidateID(id); err != nil {
		return nil, invalid("id: %s", err)
	}
	if err := request.ValidateClientID(clientID); err != nil {
		return nil, invalid("client: %s", err)
	}
	return s.q.Events(ctx, clientID, id)
}
