package admin

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// The clients with a backlog, as one read of the request stream's subjects found them.
// Reading them costs the server and this process about a millisecond per thousand
// clients, so the console, which asks every few seconds, reads them through a snapshot
// that is refreshed in the background while it is in use.

// backlogEntry is one client with a backlog.
type backlogEntry struct {
	id, subject string
	backlog     uint64
}

type backlogSnapshot struct {
	at      time.Time
	took    time.Duration // how long the read took
	entries []backlogEntry

	ageMu sync.Mutex
	byAge []Client // every client, oldest head first: read once, when first asked for
}

// byAge is every client of snap, the oldest head request first. It reads every head,
// so it does that once per snapshot, not once per page or refresh.
func (s *Service) byAge(ctx context.Context, snap *backlogSnapshot) ([]Client, error) {
	snap.ageMu.Lock()
	defer snap.ageMu.Unlock()
	if snap.byAge != nil {
		return snap.byAge, nil
	}
	all := make([]Client, len(snap.entries))
	for i, e := range snap.entries {
		all[i] = Client{ClientID: e.id, Backlog: e.backlog, subject: e.subject}
	}
	s.heads(ctx, all)
	if err := ctx.Err(); err != nil {
		return nil, err // some heads unread: not an order to keep
	}
	slices.SortFunc(all, func(a, b Client) int {
		return cmp.Or(a.OldestAt.Compare(b.OldestAt), cmp.Compare(a.ClientID, b.ClientID))
	})
	snap.byAge = all
	return all, nil
}

// Snapshots for ClientsQuery.Cached: while a read takes under snapshotCheap, every page
// reads afresh. Beyond, a snapshot younger than snapshotFresh is used as it is; one
// younger than snapshotStale is used while a fresh one is read in the background; an
// older one is read again before answering.
const (
	snapshotCheap = 50 * time.Millisecond
	snapshotFresh = 2 * time.Second
	snapshotStale = 10 * time.Second
)

type backlogCache struct {
	snapMu     sync.Mutex
	snap       *backlogSnapshot
	refreshing bool
}

// readBacklog reads every client with a backlog.
func (s *Service) readBacklog(ctx context.Context) (*backlogSnapshot, error) {
	at := time.Now()
	backlog, err := s.q.Backlog(ctx)
	if err != nil {
		return nil, err
	}
	snap := &backlogSnapshot{at: at, entries: make([]backlogEntry, 0, len(backlog))}
	for subj, n := range backlog {
		id, err := request.ClientIDOf(subj)
		if err != nil {
			id = subj // not written by ingest; shown by subject so that it can be found
		}
		snap.entries = append(snap.entries, backlogEntry{id: id, subject: subj, backlog: n})
	}
	snap.took = time.Since(at)
	return snap, nil
}

// backlog returns the clients with a backlog: read now, or with cached from the snapshot
// (see snapshotFresh).
func (s *Service) backlog(ctx context.Context, cached bool) (*backlogSnapshot, error) {
	if !cached {
		return s.readBacklog(ctx)
	}
	s.snapMu.Lock()
	snap := s.snap
	age := time.Duration(-1)
	if snap != nil && snap.took >= snapshotCheap {
		age = time.Since(snap.at)
	}
	switch {
	case age >= 0 && age < snapshotFresh:
		s.snapMu.Unlock()
		return snap, nil
	case age >= 0 && age < snapshotStale:
		if !s.refreshing {
			s.refreshing = true
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), snapshotStale)
				defer cancel()
				fresh, err := s.readBacklog(ctx)
				s.snapMu.Lock()
				defer s.snapMu.Unlock()
				s.refreshing = false
				if err == nil {
					s.snap = fresh
				}
			}()
		}
		s.snapMu.Unlock()
		return snap, nil
	}
	s.snapMu.Unlock()
	fresh, err := s.readBacklog(ctx)
	if err != nil {
		return nil, err
	}
	s.snapMu.Lock()
	if s.snap == nil || s.snap.at.Before(fresh.at) {
		s.snap = fresh
	}
	s.snapMu.Unlock()
	return fresh, nil
}

// firstN returns the first n of es in the order cmp gives, without sorting all of them
// when n is small against len(es): it keeps the best n seen in a heap whose root is the
// worst of them (O(len·log n) whatever the order of es), and sorts those at the end.
func firstN(es []backlogEntry, n int, cmp func(a, b backlogEntry) int) []backlogEntry {
	if n <= 0 {
		return []backlogEntry{}
	}
	if n >= len(es)/4 {
		out := slices.Clone(es)
		slices.SortFunc(out, cmp)
		return out[:min(n, len(out))]
	}
	h := make([]backlogEntry, 0, n)
	down := func(i int) { // restores the heap below i: every parent at least as late as its children
		for {
			worst, l, r := i, 2*i+1, 2*i+2
			if l < len(h) && cmp(h[l], h[worst]) > 0 {
				worst = l
			}
			if r < len(h) && cmp(h[r], h[worst]) > 0 {
				worst = r
			}
			if worst == i {
				return
			}
			h[i], h[worst] = h[worst], h[i]
			i = worst
		}
	}
	for _, e := range es {
		switch {
		case len(h) < n:
			h = append(h, e)
			for i := len(h) - 1; i > 0 && cmp(h[i], h[(i-1)/2]) > 0; i = (i - 1) / 2 {
				h[i], h[(i-1)/2] = h[(i-1)/2], h[i]
			}
		case cmp(e, h[0]) < 0:
			h[0] = e
			down(0)
		}
	}
	slices.SortFunc(h, cmp)
	return h
}
