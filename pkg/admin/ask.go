package admin

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/queue"
)

// Asking the running dispatchers (pkg/introspect's questions), for the admin API's
// clients, requests and budget, and the console's pages.

// ask asks the dispatchers q and decodes their answers as A, q's answer type. It stops
// waiting once as many have answered as are known to run: those with a live heartbeat
// (with leases), or as many as answered lately; so that a page is not held for the whole
// lane wait. A question that gets fewer answers waits the whole lane wait, as does the
// first after answersKept, which finds an instance that joined without leases.
func ask[A any](ctx context.Context, s *Service, q introspect.Question) []A {
	expect := s.expected(ctx)
	raw, unanswered, err := s.q.Ask(ctx, q.Name(), introspect.Body(q), s.laneWait, expect)
	if err != nil {
		return nil
	}
	s.noteReplies(raw, unanswered)
	if n := len(raw) + len(unanswered); expect == 0 || n < expect { // waited the whole lane wait: as many as there are
		s.answered(n)
	}
	out := make([]A, 0, len(raw))
	for _, r := range raw {
		var a A
		if json.Unmarshal(r, &a) == nil {
			out = append(out, a)
		}
	}
	return out
}

// answersKept is how long the count of answers a query got is relied on.
const answersKept = 30 * time.Second

// expected is how many answers to wait for: the dispatchers with a live heartbeat (read
// at most every two seconds), or more if more answered within answersKept; 0 (wait the
// whole lane wait) when neither is known.
func (s *Service) expected(ctx context.Context) int {
	s.aliveMu.Lock()
	stale := time.Since(s.aliveAt) >= 2*time.Second && !s.aliveReading
	if stale {
		s.aliveReading = true // one reader; the others use the last count meanwhile
	}
	s.aliveMu.Unlock()
	if stale {
		// Read apart from the caller's context (a page closed midway must not leave a
		// count of none) and outside the lock (a slow server must not hold every page).
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		st, err := s.q.LeaseStatus(rctx)
		cancel()
		n := 0
		for _, in := range st.Instances {
			if !in.Heartbeat.IsZero() {
				n++
			}
		}
		s.aliveMu.Lock()
		s.aliveReading = false
		if err == nil { // a failed read is not a count: keep the last, read again next time
			s.aliveN, s.aliveAt = n, time.Now()
		}
		s.aliveMu.Unlock()
	}
	s.aliveMu.Lock()
	defer s.aliveMu.Unlock()
	if time.Since(s.seenAt) >= answersKept {
		return s.aliveN
	}
	return max(s.aliveN, s.seenN)
}

// answered notes that a query that waited the whole lane wait got n answers.
func (s *Service) answered(n int) {
	s.aliveMu.Lock()
	defer s.aliveMu.Unlock()
	s.seenN, s.seenAt = n, time.Now()
}

// noteReplies keeps the word of dispatchers that could not answer, for the pages to
// show for answersKept, and forgets it for those that answered since.
func (s *Service) noteReplies(answers []json.RawMessage, us []queue.Unanswered) {
	s.aliveMu.Lock()
	none := len(us) == 0 && len(s.unanswered) == 0
	s.aliveMu.Unlock()
	if none { // as almost always: no answer decoded twice
		return
	}
	answered := make([]string, 0, len(answers))
	for _, a := range answers {
		var who struct {
			Instance string `json:"instance"`
		}
		if json.Unmarshal(a, &who) == nil {
			answered = append(answered, who.Instance)
		}
	}
	s.aliveMu.Lock()
	defer s.aliveMu.Unlock()
	if s.unanswered == nil {
		s.unanswered = map[string]unanswered{}
	}
	for _, in := range answered {
		delete(s.unanswered, in)
	}
	for _, u := range us {
		s.unanswered[u.Instance] = unanswered{why: u.Reason, at: time.Now()}
	}
}

// Unanswered says, for each dispatcher that could not answer a question lately, which
// and why: what the pages show from the dispatchers (lanes, activity, budget) lacks its
// share.
func (s *Service) Unanswered() []string {
	s.aliveMu.Lock()
	defer s.aliveMu.Unlock()
	var out []string
	for in, u := range s.unanswered {
		if time.Since(u.at) >= answersKept {
			delete(s.unanswered, in)
			continue
		}
		out = append(out, fmt.Sprintf("dispatcher %s's answer: %s", cmp.Or(in, "(unnamed)"), u.why))
	}
	slices.Sort(out)
	return out
}

type unanswered struct {
	why string
	at  time.Time
}

type aliveCache struct {
	aliveMu      sync.Mutex
	aliveAt      time.Time
	aliveN       int
	aliveReading bool
	seenAt       time.Time
	seenN        int
	unanswered   map[string]unanswered // by instance: dispatchers that could not answer lately
}
