package admin

import (
	"cmp"
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

type laneOf struct {
	schedule.LaneInfo
	instance string
}

// lanes asks the dispatchers about subjects; a subject no dispatcher holds a lane for is
// missing from the map.
func (s *Service) lanes(ctx context.Context, subjects []string) map[string]laneOf {
	out := map[string]laneOf{}
	if len(subjects) == 0 {
		return out
	}
	for _, a := range ask[introspect.LanesAnswer](ctx, s, introspect.LanesQuestion{Subjects: subjects}) {
		for _, l := range a.Lanes {
			out[l.Subject] = laneOf{l, a.Instance}
		}
	}
	return out
}

// Client is one client with a backlog.
type Client struct {
	ClientID   string    `json:"clientId"`
	Backlog    uint64    `json:"backlog"`
	OldestAt   time.Time `json:"oldestAcceptedAt,omitzero"`
	OldestAge  string    `json:"oldestAge,omitempty"`
	Lane       string    `json:"lane"`                 // waiting, in_flight, paused, idle, or none (no dispatcher holds it)
	NextSend   time.Time `json:"nextSend,omitzero"`    // earliest start of the next attempt, when waiting
	Attempts   int       `json:"attempts"`             // failed attempts of its head request so far
	Interval   string    `json:"interval,omitempty"`   // the interval in force for it
	Dispatcher string    `json:"dispatcher,omitempty"` // the instance holding its lane
	// LastDelivered is when its last delivery ended, as the instance holding its lane
	// remembers it; zero when it remembers none.
	LastDelivered time.Time         `json:"lastDelivered,omitzero"`
	Steering      *request.Steering `json:"steering,omitempty"`
	subject       string
	oldestKnown   bool
}

// Sort orders for Clients.
const (
	SortBacklog = "backlog" // largest backlog first
	SortAge     = "age"     // oldest head request first
	// SortNext: the earliest next send first (the first MaxDueLanes of each dispatcher's
	// waiting lanes), then the clients with no send due (in flight, paused, without a
	// lane) by backlog.
	SortNext = "next"
)

// ClientsQuery pages through the clients with a backlog.
type ClientsQuery struct {
	Sort  string // SortBacklog (default) or SortAge
	Limit int    // page size, 1 to 1000; default 50
	Page  int    // from 1
	// Search, if not empty, keeps the clients whose id contains it.
	Search string
	// Cached allows the list of clients and their backlogs to come from a snapshot up
	// to 10 s old (refreshed in the background after 2 s) once reading it takes over
	// 50 ms (many thousands of clients), for pages that ask often; each listed client's
	// lane, head and steering are read fresh. ClientsPage.AsOf says when the list was
	// read.
	Cached bool
}

// ClientsPage is one page of clients.
type ClientsPage struct {
	Total  int    `json:"total"`
	Page   int    `json:"page"`
	Limit  int    `json:"limit"`
	Sort   string `json:"sort"`
	Search string `json:"search,omitempty"`
	// AsOf is when the list of clients and their backlogs was read.
	AsOf    time.Time `json:"asOf"`
	Clients []Client  `json:"clients"`
	// Problems name the dispatchers that could not answer lately, and why: the lanes
	// they hold (next send, attempts, owner) are missing from the page.
	Problems []string `json:"problems,omitempty"`
}

// Clients lists the clients with a backlog, a page at a time. Sorting by age reads
// every client's head request; sorting by backlog only the page's.
func (s *Service) Clients(ctx context.Context, cq ClientsQuery) (ClientsPage, error) {
	if err := cq.check(); err != nil {
		return ClientsPage{}, err
	}
	snap, err := s.backlog(ctx, cq.Cached)
	if err != nil {
		return ClientsPage{}, err
	}
	es := snap.entries
	if cq.Search != "" {
		es = make([]backlogEntry, 0, len(snap.entries)/8)
		for _, e := range snap.entries {
			if strings.Contains(e.id, cq.Search) {
				es = append(es, e)
			}
		}
	}
	page := ClientsPage{Total: len(es), Page: cq.Page, Limit: cq.Limit, Sort: cq.Sort, Search: cq.Search, AsOf: snap.at.UTC()}
	from := min((cq.Page-1)*cq.Limit, len(es)) // no overflow: page and limit are bounded
	to := min(from+cq.Limit, len(es))
	byBacklog := func(a, b backlogEntry) int {
		return cmp.Or(cmp.Compare(b.backlog, a.backlog), cmp.Compare(a.id, b.id))
	}
	clients := func(es []backlogEntry) []Client {
		out := make([]Client, len(es))
		for i, e := range es {
			out[i] = Client{ClientID: e.id, Backlog: e.backlog, subject: e.subject}
		}
		return out
	}
	switch cq.Sort {
	case SortNext:
		due := s.dueOrder(ctx, min(cq.Page*cq.Limit, introspect.MaxDueLanes))
		page.Clients = clients(firstN(es, to, func(a, b backlogEntry) int {
			da, aok := due[a.subject]
			db, bok := due[b.subject]
			switch {
			case aok && bok:
				return cmp.Or(da.Compare(db), cmp.Compare(a.id, b.id))
			case aok:
				return -1
			case bok:
				return 1
			}
			return byBacklog(a, b)
		})[from:])
	case SortAge:
		if page.Clients, err = s.oldest(ctx, es, cq.Search, from, to); err != nil {
			return ClientsPage{}, err
		}
		if page.Clients != nil {
			break
		}
		all, err := s.byAge(ctx, snap)
		if err != nil {
			return ClientsPage{}, err
		}
		page.Clients = make([]Client, 0, max(0, to-from)) // a copy: the snapshot's order is shared
		seen := 0
		for _, c := range all {
			if cq.Search == "" || strings.Contains(c.ClientID, cq.Search) {
				if seen >= from {
					page.Clients = append(page.Clients, c)
				}
				if seen++; seen == to {
					break
				}
			}
		}
	default:
		page.Clients = clients(firstN(es, to, byBacklog)[from:])
	}
	s.heads(ctx, page.Clients)
	s.describe(ctx, page.Clients)
	page.Problems = s.Unanswered()
	return page, nil
}

// check sets cq's defaults and says what is wrong with it.
func (cq *ClientsQuery) check() error {
	cq.Sort = cmp.Or(cq.Sort, SortBacklog)
	cq.Limit = cmp.Or(cq.Limit, 50)
	cq.Page = cmp.Or(cq.Page, 1)
	if cq.Sort != SortBacklog && cq.Sort != SortAge && cq.Sort != SortNext {
		return invalid("sort %q: use %q, %q or %q", cq.Sort, SortBacklog, SortAge, SortNext)
	}
	if len(cq.Search) > request.MaxClientIDBytes {
		return invalid("search: at most %d bytes (a clientId's length)", request.MaxClientIDBytes)
	}
	if cq.Limit < 1 || cq.Limit > 1000 || cq.Page < 1 || cq.Page > 1_000_000 {
		return invalid("limit %d, page %d: limit is 1 to 1000, page 1 to 1000000", cq.Limit, cq.Page)
	}
	return nil
}

// oldestRead is the most requests oldest reads to find the page's clients
// (Service.oldestRead, which tests lower to take the other way).
const oldestRead = 200_000

// oldest is the clients from-to (of es) with the oldest head requests, read in the
// queue's order; nil when reading oldestRead requests did not find them all (a few
// clients hold most of the backlog), and every head must be read.
func (s *Service) oldest(ctx context.Context, es []backlogEntry, search string, from, to int) ([]Client, error) {
	if to <= from {
		return []Client{}, nil
	}
	backlog := make(map[string]uint64, len(es))
	for _, e := range es {
		backlog[e.subject] = e.backlog
	}
	var out []Client
	errEnough := errors.New("enough")
	seen := 0
	want := s.oldestHeadsWanted(search, to)
	heads, complete, err := s.q.OldestHeads(ctx, want, s.oldestRead)
	if err != nil {
		return nil, err
	}
	for _, h := range heads {
		id, ierr := request.ClientIDOf(h.Subject)
		if ierr != nil {
			id = h.Subject
		}
		if search != "" && !strings.Contains(id, search) {
			continue
		}
		if seen >= from {
			out = append(out, Client{ClientID: id, Backlog: backlog[h.Subject], subject: h.Subject, OldestAt: h.AcceptedAt, oldestKnown: true})
		}
		seen++
		if seen == to {
			err = errEnough
			break
		}
	}
	// Short of the page: complete unless the read stopped short, or, with a search, it
	// found as many heads as it asked for and a match may come after them.
	if err == nil && (!complete || search != "" && len(heads) == want) {
		return nil, nil
	}
	if out == nil {
		out = []Client{}
	}
	return out, nil
}

// oldestHeadsWanted is how many heads to read for a page ending at to: with a search,
// as many as oldestRead allows, since the matching clients may come late.
func (s *Service) oldestHeadsWanted(search string, to int) int {
	if search != "" {
		return s.oldestRead
	}
	return to
}

// dueOrder asks the dispatchers for up to n waiting lanes each, the earliest due first,
// and returns their next sends by subject.
func (s *Service) dueOrder(ctx context.Context, n int) map[string]time.Time {
	out := map[string]time.Time{}
	for _, a := range ask[introspect.LanesAnswer](ctx, s, introspect.DueLanesQuestion{Limit: n}) {
		for _, l := range a.Lanes {
			out[l.Subject] = l.NextSend
		}
	}
	return out
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
			st, ok, _ := s.head(ctx, c.subject)
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
			c.OldestAge = Age(now.Sub(c.OldestAt))
		}
		c.Lane = "none"
		if l, ok := lanes[c.subject]; ok {
			c.Lane, c.NextSend, c.Attempts, c.Interval, c.Dispatcher = l.State, l.NextSend, l.Attempts, l.Interval.String(), l.instance
			c.LastDelivered = l.LastDelivered
		}
		if st, err := s.ctl.Client(ctx, c.ClientID); err == nil && !st.IsZero() {
			c.Steering = &st
			if st.Paused && c.Lane == schedule.LaneWaiting {
				// Paused but not yet looked at again: it will park, not send.
				c.Lane, c.NextSend = schedule.LanePaused, time.Time{}
			}
		}
	}
}
