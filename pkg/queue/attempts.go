package queue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// EarlierAttempts reads what the record holds of the attempts already made of st, the
// request queued now as st (its copy and replay cycle: st.Seq), by any dispatcher: how
// many, and when one of them was made (the earlier of the two events found: an
// attempt's start when it ran long enough to be recorded as started, else its end;
// MaxAge counts from it). It reads the last attempt_started and the last
// attempt_failed event of st's client, two direct gets: by G3 no request queued behind
// st has been attempted, and those ahead of it ended before its first attempt, so once
// st was attempted its latest attempt events are its client's last; an event of another
// request there means st has none of that type. None: 0 and the zero time. An attempt
// that left no event (one that ended in a crash within StartedEventAfter) is not
// counted. With events off it finds none.
func (q *Queue) EarlierAttempts(ctx context.Context, st request.Stored) (n int, at time.Time, err error) {
	if q.cfg.NoEvents {
		return 0, time.Time{}, nil
	}
	types := []request.EventType{request.EventAttemptStarted, request.EventAttemptFailed}
	found := make([]*request.Event, len(types))
	errs := make([]error, len(types))
	var wg sync.WaitGroup
	for i, typ := range types {
		wg.Go(func() {
			m, err := DirectGet(ctx, q.nc, EventStream, struct {
				Last string `json:"last_by_subj"`
			}{request.ClientEventSubject(st.ClientID, typ)})
			if err != nil || m == nil {
				errs[i] = err
				return
			}
			if e, ok := eventOf(m, st.ID); ok && e.Seq == st.Seq && e.Attempt > 0 {
				found[i] = &e
			}
		})
	}
	wg.Wait()
	for _, e := range found {
		if e == nil {
			continue
		}
		n = max(n, e.Attempt)
		if at.IsZero() || e.At.Before(at) {
			at = e.At
		}
	}
	if err := errors.Join(errs...); err != nil {
		return n, at, fmt.Errorf("reading the request's earlier attempts: %w", err)
	}
	return n, at, nil
}
