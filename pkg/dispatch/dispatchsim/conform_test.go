package dispatchsim_test

import (
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/dispatch/dispatchsim"
)

// The simulation's fakes pass the suites pkg/queue's adapters pass (see pkg/queue's
// TestLeaseStoreConformance and TestSourceConformance).
func TestSimulatedLeaseStoreConforms(t *testing.T) {
	t.Parallel()
	dispatchsim.ConformLeaseStore(t, func(*testing.T) dispatchsim.LeaseStoreUnderTest {
		return dispatchsim.QuietLeaseStore(30 * time.Second)
	})
}

func TestSimulatedQueueConforms(t *testing.T) {
	t.Parallel()
	dispatchsim.ConformSource(t, func(*testing.T) dispatchsim.SourceUnderTest { return dispatchsim.QuietSource() })
}
