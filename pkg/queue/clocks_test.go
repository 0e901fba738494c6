package queue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// A request's events are read from a little before its id's time (ingest's clock), the
// events' times being the store's: eventClockMargin is how far apart the two clocks may
// be for one read to find them. An ingest whose clock is ahead by less than that costs
// nothing more; one ahead by more costs a second, wider read, never a wrong status; one
// behind costs nothing. Each case is a request delivered and one still queued.
func TestAStatusIsReadWhateverTheClocksApart(t *testing.T) {
	t.Parallel()
	nc, q := openOnServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := runWriter(t, q, nil)
	for _, c := range []struct {
		name  string
		ahead time.Duration // how far ingest's clock is ahead of the store's
		wide  bool          // whether the read must go back further than the margin
	}{
		{"ingest ahead within the margin", 50 * time.Millisecond, false},
		{"ingest ahead beyond the margin", 3 * time.Second, true},
		{"ingest behind", -3 * time.Second, false},
	} {
		for i, state := range []request.State{request.StateDelivered, request.StateInFlight} {
			client := fmt.Sprintf("clock-%d-%d", int(c.ahead/time.Millisecond), i)
			made := time.Now().Add(c.ahead)
			id := request.NewID(made)
			w.Record(request.Event{Type: request.EventAttemptStarted, ID: id, ClientID: client, Seq: 1, At: made})
			if state == request.StateDelivered {
				w.Record(request.Event{Type: request.EventDelivered, ID: id, ClientID: client, Attempt: 1, Status: 200})
			}
			stored(t, w)
			var st request.Status
			gets := directGets(t, nc, func() (err error) { st, err = q.Status(ctx, client, id); return err })
			if st.State != state {
				t.Fatalf("%s: status %+v, want %s", c.name, st, state)
			}
			idTime, _ := request.IDTime(id)
			wider := 0
			for _, get := range gets {
				if !get.StartTime.IsZero() && get.StartTime.Before(idTime.Add(-time.Second)) {
					wider++
				}
			}
			if c.wide != (wider > 0) {
				t.Errorf("%s, %s: %d of %d gets start more than a second before the id's time; want them only when the clocks are further apart than the margin",
					c.name, state, wider, len(gets))
			}
		}
	}
}
