package integration

import (
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/ledger"
)

// A randomized chaos run, bounded in time and reproducible from its printed seed
// (CHAOS_SEED=n to replay one, CHAOS_DURATION=2m to run longer). Faults: dispatcher
// processes killed with SIGKILL or stopped with SIGTERM and replaced, NATS nodes stopped
// and restarted (one at a time, so the cluster keeps its quorum), raven answering 503,
// 429 with Retry-After, or slower than the send timeout. Requests are posted all along.
// At the end the ledger is checked like every other test's.
func TestChaos(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: %v", v, err)
		}
		seed = n
	}
	// A short sample by default: the seeded soak (cmd/soak) is the long run of these
	// faults, through the binaries.
	duration := 25 * time.Second
	if v := os.Getenv("CHAOS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("CHAOS_DURATION=%q: %v", v, err)
		}
		duration = d
	}
	if testing.Short() {
		duration = 10 * time.Second
	}
	t.Logf("chaos seed=%d duration=%s (rerun with CHAOS_SEED=%d)", seed, duration, seed)
	rng := rand.New(rand.NewPCG(seed, seed>>1|1))

	const (
		modeOK = iota
		mode503
		mode429
		modeSlow
	)
	var mode atomic.Int32
	c := newClusterStack(t, options{interval: 200 * time.Millisecond, respond: func(ledger.Arrival) ledger.Response {
		switch mode.Load() {
		case mode503:
			return ledger.Response{Status: http.StatusServiceUnavailable}
		case mode429:
			return ledger.Response{Status: http.StatusTooManyRequests, RetryAfter: "1"}
		case modeSlow:
			return ledger.Response{Delay: time.Minute} // held until the sender gives up at its send timeout
		}
		return ledger.Response{}
	}})

	type instance struct {
		id string
		p  *proc
	}
	var live []instance
	next := 0
	spawn := func() {
		next++
		id := "d" + strconv.Itoa(next)
		live = append(live, instance{id, c.startDispatcher(id)})
	}
	spawn()
	spawn()

	const clients = 32
	stopFeed := c.feed(clients, 80*time.Millisecond)
	faults := map[string]int{}
	nodeDown, nodeUpAt := -1, time.Time{}
	deadline := time.Now().Add(duration)
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond)
		if nodeDown >= 0 && time.Now().After(nodeUpAt) {
			c.cluster.Start(nodeDown)
			nodeDown = -1
		}
		switch rng.IntN(5) {
		case 0: // crash a dispatcher and replace it
			i := rng.IntN(len(live))
			live[i].p.signal(syscall.SIGKILL)
			live = append(live[:i], live[i+1:]...)
			spawn()
			faults["dispatcher_kill"]++
		case 1: // stop a dispatcher gracefully; sometimes add one
			if len(live) > 1 {
				i := rng.IntN(len(live))
				live[i].p.signal(syscall.SIGTERM)
				live = append(live[:i], live[i+1:]...)
				faults["dispatcher_term"]++
			}
			if len(live) < 3 {
				spawn()
			}
		case 2: // stop a NATS node for a while
			if nodeDown < 0 {
				nodeDown = rng.IntN(3)
				nodeUpAt = time.Now().Add(time.Duration(1000+rng.IntN(3000)) * time.Millisecond)
				c.cluster.Stop(nodeDown)
				faults["nats_node_stop"]++
			}
		default: // raven changes its ways
			m := int32(rng.IntN(4))
			mode.Store(m)
			faults["raven_mode_"+[]string{"ok", "503", "429", "slow"}[m]]++
		}
	}
	if nodeDown >= 0 {
		c.cluster.Start(nodeDown)
	}
	mode.Store(modeOK)
	stopFeed()
	rep := c.finish(3*time.Minute, faults["dispatcher_kill"]*clients)
	t.Logf("chaos summary: seed=%d accepted=%d delivered=%d dead=%d duplicates=%d min_gap=%s faults=%v",
		seed, c.acceptedCount(), rep.Delivered, rep.Dead, rep.Duplicates, rep.MinGap, faults)
}
