// Package admin is what operators do to a running service: inspect clients, requests
// and dead letters, replay dead letters, and steer the dispatchers (intervals, pause,
// purge). The dispatchctl command and the dispatcher's admin HTTP API are both thin
// layers over it; neither ever deletes a request outright.
package admin

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// ErrInvalid marks an operator's mistake (a bad filter, a missing confirmation): the
// error text says what to change.
var ErrInvalid = errors.New("invalid")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Service runs operators' commands against one queue.
type Service struct {
	q        *queue.Queue
	ctl      *queue.Control
	log      zerolog.Logger
	replayed prometheus.Counter // nil: not counted
	// LaneWait is how long to wait for dispatchers to describe their lanes.
	LaneWait time.Duration
}

// New returns a Service. reg, if not nil, gets the dispatch_replayed_total counter.
func New(q *queue.Queue, ctl *queue.Control, log zerolog.Logger, reg prometheus.Registerer) *Service {
	s := &Service{q: q, ctl: ctl, log: log.With().Str("component", "admin").Logger(), LaneWait: 300 * time.Millisecond}
	if reg != nil {
		s.replayed = prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dispatch_replayed_total",
			Help: "Dead letters put back in their client's queue by a replay through this process.",
		})
		reg.MustRegister(s.replayed)
	}
	return s
}

// LaneAnswer is one dispatcher's answer to a lane query.
type LaneAnswer struct {
	Instance  string              `json:"instance"`
	Lanes     []dispatch.LaneInfo `json:"lanes,omitempty"`
	Delivered []dispatch.Delivery `json:"delivered,omitempty"`
}

// ServeLanes makes d answer lane queries, as instance; stop it with the returned function.
func ServeLanes(q *queue.Queue, d *dispatch.Dispatcher, instance string) (stop func(), err error) {
	return q.ServeLaneQueries(func(ctx context.Context, lq queue.LaneQuery) (any, error) {
		a := LaneAnswer{Instance: instance}
		for _, id := range lq.IDs {
			if dl, ok := d.Delivered(id); ok {
				a.Delivered = append(a.Delivered, dl)
			}
		}
		if len(lq.Subjects) > 0 || len(lq.IDs) == 0 {
			limit := lq.Limit
			if limit <= 0 || limit > 1000 {
				limit = 1000
			}
			var err error
			if a.Lanes, err = d.Lanes(ctx, lq.Subjects, limit); err != nil {
				return nil, err
			}
		}
		return a, nil
	})
}

type laneOf struct {
	dispatch.LaneInfo
	instance string
}

// lanes asks the dispatchers about subjects; a subject no dispatcher holds a lane for is
// missing from the map.
func (s *Service) lanes(ctx context.Context, subjects []string) map[string]laneOf {
	out := map[string]laneOf{}
	if len(subjects) == 0 {
		return out
	}
	answers, err := s.q.QueryLanes(ctx, queue.LaneQuery{Subjects: subjects}, s.LaneWait)
	if err != nil {
		return out
	}
	for _, raw := range answers {
		var a LaneAnswer
		if json.Unmarshal(raw, &a) != nil {
			continue
		}
		for _, l := range a.Lanes {
			out[l.Subject] = laneOf{l, a.Instance}
		}
	}
	return out
}

// Client is one client with a backlog.
type Client struct {
	ClientID    string          `json:"client_id"`
	Backlog     uint64          `json:"backlog"`
	OldestAt    time.Time       `json:"oldest_accepted_at,omitzero"`
	OldestAge   string          `json:"oldest_age,omitempty"`
	Lane        string          `json:"lane"`                 // waiting, in_flight, paused, idle, or none (no dispatcher holds it)
	NextSend    time.Time       `json:"next_send,omitzero"`   // earliest start of the next attempt, when waiting
	Attempts    int             `json:"attempts"`             // failed attempts of its head request so far
	Interval    string          `json:"interval,omitempty"`   // the interval in force for it
	Dispatcher  string          `json:"dispatcher,omitempty"` // the instance holding its lane
	Steering    *queue.Steering `json:"steering,omitempty"`
	subject     string
	oldestKnown bool
}

// Sort orders for Clients.
const (
	SortBacklog = "backlog" // largest backlog first
	SortAge     = "age"     // oldest head request first
)

// ClientsQuery pages through the clients with a backlog.
type ClientsQuery struct {
	Sort  string // SortBacklog (default) or SortAge
	Limit int    // page size, 1 to 1000; default 50
	Page  int    // from 1
}

// ClientsPage is one page of clients.
type ClientsPage struct {
	Total   int      `json:"total"`
	Page    int      `json:"page"`
	Limit   int      `json:"limit"`
	Sort    string   `json:"sort"`
	Clients []Client `json:"clients"`
}

// Clients lists the clients with a backlog, a page at a time. Sorting by age reads
// every client's head request; sorting by backlog only the page's.
func (s *Service) Clients(ctx context.Context, cq ClientsQuery) (ClientsPage, error) {
	cq.Sort = cmp.Or(cq.Sort, SortBacklog)
	cq.Limit = cmp.Or(cq.Limit, 50)
	cq.Page = cmp.Or(cq.Page, 1)
	if cq.Sort != SortBacklog && cq.Sort != SortAge {
		return ClientsPage{}, invalid("sort %q: use %q or %q", cq.Sort, SortBacklog, SortAge)
	}
	if cq.Limit < 1 || cq.Limit > 1000 || cq.Page < 1 || cq.Page > 1_000_000 {
		return ClientsPage{}, invalid("limit %d, page %d: limit is 1 to 1000, page 1 to 1000000", cq.Limit, cq.Page)
	}
	backlog, err := s.q.Backlog(ctx)
	if err != nil {
		return ClientsPage{}, err
	}
	all := make([]Client, 0, len(backlog))
	for subj, n := range backlog {
		id, err := queue.ClientIDOf(subj)
		if err != nil {
			id = subj // not written by ingest; shown by subject so that it can be found
		}
		all = append(all, Client{ClientID: id, Backlog: n, subject: subj})
	}
	page := ClientsPage{Total: len(all), Page: cq.Page, Limit: cq.Limit, Sort: cq.Sort}
	if cq.Sort == SortAge {
		s.heads(ctx, all)
		slices.SortFunc(all, func(a, b Client) int {
			return cmp.Or(a.OldestAt.Compare(b.OldestAt), cmp.Compare(a.ClientID, b.ClientID))
		})
	} else {
		slices.SortFunc(all, func(a, b Client) int {
			return cmp.Or(cmp.Compare(b.Backlog, a.Backlog), cmp.Compare(a.ClientID, b.ClientID))
		})
	}
	from := min((cq.Page-1)*cq.Limit, len(all)) // no overflow: page and limit are bounded
	page.Clients = all[from:min(from+cq.Limit, len(all))]
	s.heads(ctx, page.Clients)
	s.describe(ctx, page.Clients)
	return page, nil
}

// heads fills in each client's oldest request, reading heads eight at a time.
func (s *Service) heads(ctx context.Context, cs []Client) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range cs {
		if cs[i].oldestKnown {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func(c *Client) {
			defer func() { <-sem; wg.Done() }()
			st, ok, _ := s.q.Head(ctx, c.subject)
			if ok {
				c.OldestAt = st.AcceptedAt
			}
			c.oldestKnown = true
		}(&cs[i])
	}
	wg.Wait()
}

// describe adds the dispatchers' view and the steering to each client.
func (s *Service) describe(ctx context.Context, cs []Client) {
	subjects := make([]string, len(cs))
	for i, c := range cs {
		subjects[i] = c.subject
	}
	lanes := s.lanes(ctx, subjects)
	now := time.Now()
	for i := range cs {
		c := &cs[i]
		if !c.OldestAt.IsZero() {
			c.OldestAge = now.Sub(c.OldestAt).Round(time.Millisecond).String()
		}
		c.Lane = "none"
		if l, ok := lanes[c.subject]; ok {
			c.Lane, c.NextSend, c.Attempts, c.Interval, c.Dispatcher = l.State, l.NextSend, l.Attempts, l.Interval.String(), l.instance
		}
		if st, err := s.ctl.Client(ctx, c.ClientID); err == nil && !st.IsZero() {
			c.Steering = &st
			if st.Paused && c.Lane == dispatch.LaneWaiting {
				// Paused but not yet looked at again: it will park, not send.
				c.Lane, c.NextSend = dispatch.LanePaused, time.Time{}
			}
		}
	}
}

// Request states.
const (
	StateQueued       = "queued"
	StateInFlight     = "in_flight"
	StateDeadLettered = "dead_lettered"
	StateSent         = "sent"
	StateNotQueued    = "not_queued"
)

// RequestState is where one request is.
type RequestState struct {
	ID         string             `json:"id"`
	State      string             `json:"state"`
	Detail     string             `json:"detail"`
	ClientID   string             `json:"client_id,omitempty"`
	AcceptedAt time.Time          `json:"accepted_at,omitzero"`
	Position   *int64             `json:"position,omitempty"` // requests ahead of it in its client's queue
	Lane       *dispatch.LaneInfo `json:"lane,omitempty"`
	Dispatcher string             `json:"dispatcher,omitempty"`
	DeadLetter *DeadLetter        `json:"dead_letter,omitempty"`
	Delivery   *dispatch.Delivery `json:"delivery,omitempty"`
}

// Request says where the request with this id is. clientID, if given, narrows the
// search to that client's queue, which is much faster on a large backlog.
func (s *Service) Request(ctx context.Context, id, clientID string) (RequestState, error) {
	if id == "" {
		return RequestState{}, invalid("a request id is required")
	}
	if clientID != "" {
		if err := request.ValidateClientID(clientID); err != nil {
			return RequestState{}, invalid("client: %s", err)
		}
	}
	f, ok, err := s.q.FindRequest(ctx, id, clientID)
	if err != nil {
		return RequestState{}, err
	}
	if ok {
		rs := RequestState{ID: id, State: StateQueued, ClientID: f.ClientID, AcceptedAt: f.AcceptedAt}
		if f.Position >= 0 {
			rs.Position = &f.Position
		}
		head, hok, _ := s.q.Head(ctx, f.Subject)
		isHead := hok && head.Seq == f.Seq
		if l, ok := s.lanes(ctx, []string{f.Subject})[f.Subject]; ok {
			rs.Lane, rs.Dispatcher = &l.LaneInfo, l.instance
			if isHead && l.State == dispatch.LaneInFlight {
				rs.State = StateInFlight
			}
		}
		switch {
		case rs.State == StateInFlight:
			rs.Detail = "at the head of its client's queue, with a dispatcher now"
		case isHead:
			rs.Detail = "at the head of its client's queue; see lane.next_send"
		default:
			rs.Detail = "queued behind earlier requests of its client"
		}
		return rs, nil
	}
	var dead *DeadLetter
	err = s.q.EachDeadLetter(ctx, queue.DeadFilter{ID: id, ClientID: clientID}, func(r queue.DeadRecord) error {
		d := viewOf(r)
		dead = &d
		return nil // keep the latest: a request dead-lettered, replayed and dead-lettered again
	})
	if err != nil {
		return RequestState{}, err
	}
	if dead != nil {
		return RequestState{ID: id, State: StateDeadLettered, ClientID: dead.ClientID, AcceptedAt: dead.AcceptedAt, DeadLetter: dead,
			Detail: "in the dead-letter stream (" + dead.Reason + "); replay puts it back in its client's queue"}, nil
	}
	if answers, err := s.q.QueryLanes(ctx, queue.LaneQuery{IDs: []string{id}}, s.LaneWait); err == nil {
		for _, raw := range answers {
			var a LaneAnswer
			if json.Unmarshal(raw, &a) != nil || len(a.Delivered) == 0 {
				continue
			}
			d := a.Delivered[0]
			rs := RequestState{ID: id, State: StateSent, Dispatcher: a.Instance, Delivery: &d,
				Detail: fmt.Sprintf("raven accepted it at %s, on attempt %d", d.Delivered.UTC().Format(time.RFC3339Nano), d.Attempt)}
			rs.ClientID, _ = queue.ClientIDOf(d.Subject)
			return rs, nil
		}
	}
	return RequestState{ID: id, State: StateNotQueued,
		Detail: "neither queued, nor dead-lettered, nor among the running dispatchers' recent deliveries: raven accepted it a while ago, or it was never accepted (check the id; ingest's 202 gives it)"}, nil
}

// DeadLetter is one dead letter, for operators.
type DeadLetter struct {
	Seq          uint64    `json:"seq"`
	ID           string    `json:"id"`
	ClientID     string    `json:"client_id"`
	Reason       string    `json:"reason"`
	LastStatus   int       `json:"last_status,omitempty"`
	LastError    string    `json:"last_error,omitempty"`
	Attempts     int       `json:"attempts"`
	AcceptedAt   time.Time `json:"accepted_at,omitzero"`
	FirstAttempt time.Time `json:"first_attempt,omitzero"`
	LastAttempt  time.Time `json:"last_attempt,omitzero"`
	DeadAt       time.Time `json:"dead_at"`
	BodyBytes    int       `json:"body_bytes"`
}

func viewOf(r queue.DeadRecord) DeadLetter {
	return DeadLetter{Seq: r.Seq, ID: r.ID, ClientID: r.ClientID, Reason: r.Reason, LastStatus: r.LastStatus, LastError: r.LastError,
		Attempts: r.Attempts, AcceptedAt: r.AcceptedAt, FirstAttempt: r.FirstAttempt, LastAttempt: r.LastAttempt, DeadAt: r.DeadAt, BodyBytes: len(r.Body)}
}

// DeadLetters lists up to limit dead letters f selects, oldest first, and how many it
// selects in all.
func (s *Service) DeadLetters(ctx context.Context, f queue.DeadFilter, limit int) (list []DeadLetter, total int, err error) {
	if err := checkFilter(f); err != nil {
		return nil, 0, err
	}
	limit = cmp.Or(limit, 100)
	list = []DeadLetter{}
	err = s.q.EachDeadLetter(ctx, f, func(r queue.DeadRecord) error {
		total++
		if len(list) < limit {
			list = append(list, viewOf(r))
		}
		return nil
	})
	return list, total, err
}

func checkFilter(f queue.DeadFilter) error {
	if f.ClientID != "" {
		if err := request.ValidateClientID(f.ClientID); err != nil {
			return invalid("client: %s", err)
		}
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return invalid("since %s is not before until %s", f.Since.Format(time.RFC3339), f.Until.Format(time.RFC3339))
	}
	return nil
}

// Replay outcomes of one dead letter.
const (
	ReplayWouldRequeue = "would_requeue" // dry run
	ReplayRequeued     = "requeued"
	ReplayAlready      = "already_requeued" // an earlier, interrupted run had queued it
	ReplaySkipped      = "skipped"          // it stays in the dead-letter stream; see Why
)

// ReplayItem is what a replay did with one dead letter.
type ReplayItem struct {
	DeadLetter
	Outcome string `json:"outcome"`
	Why     string `json:"why,omitempty"`
}

// ReplayReport sums a replay up.
type ReplayReport struct {
	DryRun   bool `json:"dry_run"`
	Matched  int  `json:"matched"`
	Requeued int  `json:"requeued"`
	Skipped  int  `json:"skipped"`
}

// Replay puts the dead letters f selects back at the end of their clients' queues,
// oldest first, keeping their ids; with dryRun it only says which it would. An empty
// filter replays everything and needs all to be true. each, if not nil, hears of every
// dead letter as it is handled. A replay stopped midway (an error, ctx) can be run again:
// what it requeued is gone from the dead-letter stream, and a dead letter requeued but
// not yet removed is not queued twice.
func (s *Service) Replay(ctx context.Context, f queue.DeadFilter, all, dryRun bool, each func(ReplayItem)) (ReplayReport, error) {
	rep := ReplayReport{DryRun: dryRun}
	if f == (queue.DeadFilter{}) && !all {
		return rep, invalid("replaying every dead letter needs all (--all); or select by id, client or time range")
	}
	if err := checkFilter(f); err != nil {
		return rep, err
	}
	err := s.q.EachDeadLetter(ctx, f, func(r queue.DeadRecord) error {
		rep.Matched++
		item := ReplayItem{DeadLetter: viewOf(r), Outcome: ReplayWouldRequeue}
		if !dryRun {
			queued, err := s.q.Requeue(ctx, r)
			switch {
			case errors.Is(err, request.ErrBacklogFull), errors.Is(err, request.ErrQueueFull):
				item.Outcome, item.Why = ReplaySkipped, err.Error()
				rep.Skipped++
			case err != nil && r.ClientID == "":
				item.Outcome, item.Why = ReplaySkipped, err.Error()
				rep.Skipped++
			case err != nil:
				return err // the queue is unreachable: stop; running again is safe
			case queued:
				item.Outcome = ReplayRequeued
				rep.Requeued++
			default:
				item.Outcome = ReplayAlready
				rep.Requeued++
			}
			if item.Outcome != ReplaySkipped {
				if s.replayed != nil {
					s.replayed.Inc()
				}
				s.log.Info().Str("request_id", r.ID).Str("client_id", r.ClientID).Str("outcome", item.Outcome).Msg("dead letter replayed")
			}
		}
		if each != nil {
			each(item)
		}
		return ctx.Err()
	})
	return rep, err
}
