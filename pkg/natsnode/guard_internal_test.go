package natsnode

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"
)

// A store that broke again after staying fine for a minute is a new episode: its first
// restart comes after the least backoff, not after one grown by earlier episodes. (The
// reset used to look at the store's health when the restart came, which is always
// broken then: after eight episodes a soak's node waited 2.5 minutes to restart.)
// Restarts that do not help still back off.
func TestGuardBackoffResetsAfterASettledStore(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		g := &StoreGuard{log: zerolog.Nop(), backoff: guardMaxBackoff / 2, lastRestart: time.Now(), err: errors.New("disk full")}
		g.setState(nil, true) // the last restart worked
		time.Sleep(2 * time.Minute)
		g.setState(errors.New("disk full again"), true)
		time.Sleep(guardRestartBackoff)
		if !g.restartDue() {
			t.Fatalf("a store fine for 2 minutes broke again: no restart due after %s (backoff %s)", guardRestartBackoff, g.backoff)
		}
		g.noteRestart()
		if g.backoff != guardRestartBackoff {
			t.Fatalf("backoff after the first restart of a new episode: %s, want %s", g.backoff, guardRestartBackoff)
		}
		g.noteRestart() // it did not help
		if g.backoff != 2*guardRestartBackoff {
			t.Fatalf("backoff after a second restart in one episode: %s, want %s", g.backoff, 2*guardRestartBackoff)
		}
	})
}
