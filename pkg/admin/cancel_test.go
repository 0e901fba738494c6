package admin_test

import (
	"testing"

	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// ServeCancels passes the dispatcher's outcome on by its word: each must be the shared
// word for it, which ingest and the admin API answer by.
func TestCancelOutcomeWordsAreTheSharedOnes(t *testing.T) {
	t.Parallel()
	for o, want := range map[dispatch.CancelOutcome]string{
		dispatch.Cancelled:       request.CancelCancelled,
		dispatch.CancelInFlight:  request.CancelInFlight,
		dispatch.CancelNotQueued: request.CancelNotQueued,
		dispatch.CancelHandover:  request.CancelHandover,
	} {
		if o.String() != want {
			t.Errorf("dispatch's outcome %q is the shared word %q", o, want)
		}
	}
}
