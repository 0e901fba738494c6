package admin_test

import (
	"testing"

	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/queue"
)

// ServeCancels passes the dispatcher's outcome on by its word: each must be the queue's
// word for it, which ingest and the admin API answer by.
func TestCancelOutcomeWordsAreTheQueues(t *testing.T) {
	t.Parallel()
	for o, want := range map[dispatch.CancelOutcome]string{
		dispatch.Cancelled:       queue.CancelCancelled,
		dispatch.CancelInFlight:  queue.CancelInFlight,
		dispatch.CancelNotQueued: queue.CancelNotQueued,
		dispatch.CancelHandover:  queue.CancelHandover,
	} {
		if o.String() != want {
			t.Errorf("dispatch's outcome %q is the queue's %q", o, want)
		}
	}
}
