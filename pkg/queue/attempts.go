package queue

import (
	"context"
	"errors"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// attemptsReadLimit bounds how many of a client's attempt events of one type a read of
// earlier attempts looks through: a client failing for hours has that many after the
// request was queued, at most a few per interval.
const attemptsReadLimit = 4096

// EarlierAttempts reads what the record holds of the attempts already made of st, the
// request queued now as st (its copy and replay cycle: st.Seq), by any dispatcher: how
// many (the highest attempt number of its attempt_started and attempt_failed events) and
// when the first was made (the earliest of those events: its start when it ran long
// enough to be recorded as started, else its end). None: 0 and the zero time. An
// attempt that left no event (one that ended in a crash within StartedEventAfter) is
// not counted. With events off it finds none.
func (q *Queue) EarlierAttempts(ctx context.Context, st request.Stored) (n int, first time.Time, err error) {
	if q.cfg.NoEvents {
		return 0, time.Time{}, nil
	}
	r := &eventRead{q: q, client: st.ClientID, id: st.ID, seen: map[uint64]bool{}}
	found, err := r.scanAll(ctx, st.AcceptedAt.Add(-eventClockMargin), []scan{
		{filter: request.ClientEventSubject(st.ClientID, request.EventAttemptStarted), limit: attemptsReadLimit},
		{filter: request.ClientEventSubject(st.ClientID, request.EventAttemptFailed), limit: attemptsReadLimit},
	})
	for _, events := range found {
		for _, e := range events {
			if e.Seq != st.Seq || e.Cycle != st.Cycle || e.Attempt <= 0 {
				continue // an earlier copy's or cycle's
			}
			n = max(n, e.Attempt)
			if at := made(e); first.IsZero() || at.Before(first) {
				first = at
			}
		}
	}
	if err != nil {
		return n, first, errors.Join(errors.New("reading the request's earlier attempts"), err)
	}
	return n, first, nil
}
