package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/ledger"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// ctl runs the dispatchctl binary against the stack's NATS with stdin as its input and
// returns what it printed; the test fails unless it exits with want.
func (s *stack) ctl(want int, stdin string, args ...string) string {
	s.t.Helper()
	url := s.opts.natsURL
	if s.srv != nil {
		url = s.srv.ClientURL()
	}
	cmd := exec.Command(ctlBin, args...)
	cmd.Env = []string{"NATS_URL=" + url, "PATH=" + os.Getenv("PATH")}
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if _, isExit := err.(*exec.ExitError); err != nil && !isExit {
		s.t.Fatalf("dispatchctl %q: %v", args, err)
	}
	if code := cmd.ProcessState.ExitCode(); code != want {
		s.t.Fatalf("dispatchctl %q: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", args, code, want, &stdout, &stderr)
	}
	return stdout.String() + stderr.String()
}

// ctlJSON runs a dispatchctl command with -json and decodes what it printed into v.
func (s *stack) ctlJSON(v any, cmd string, args ...string) {
	s.t.Helper()
	out := s.ctl(0, "", append([]string{cmd, "-json"}, args...)...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		s.t.Fatalf("dispatchctl %s -json %q printed what is not JSON (%v):\n%s", cmd, args, err, out)
	}
}

// arrivalsOf returns client's arrivals at raven, in order.
func (s *stack) arrivalsOf(client string) []ledger.Arrival {
	var out []ledger.Arrival
	for _, a := range s.ledger.Arrivals() {
		if a.ClientID == client {
			out = append(out, a)
		}
	}
	return out
}

func (s *stack) deliveredIDs() map[string]int {
	out := map[string]int{}
	for _, a := range s.ledger.Arrivals() {
		if a.Status < 300 && !a.Aborted {
			out[a.ID]++
		}
	}
	return out
}

func (s *stack) markReplayed(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.replayed == nil {
		s.replayed = map[string]bool{}
	}
	for _, id := range ids {
		s.replayed[id] = true
	}
}

// failWhile answers 400 (a permanent failure: straight to the dead-letter stream) while
// the flag is set, else 200.
func failWhile(failing *atomic.Bool) func(ledger.Arrival) ledger.Response {
	return func(ledger.Arrival) ledger.Response {
		if failing.Load() {
			return ledger.Response{Status: 400}
		}
		return ledger.Response{}
	}
}

type deadList = admin.DeadLettersPage[request.DeadLetter]

func TestReplayFromTheDeadLetterStream(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	failing.Store(true)
	s := newStack(t, options{respond: failWhile(&failing)})
	alice := []string{s.post("alice", 1), s.post("alice", 2), s.post("alice", 3)}
	bob := []string{s.post("bob", 1), s.post("bob", 2)}
	waitFor(t, time.Minute, "all five to be dead-lettered", func() bool { return len(s.dead()) == 5 })

	var dl deadList
	s.ctlJSON(&dl, "deadletters", "-client", "alice")
	if dl.Total != 3 || len(dl.DeadLetters) != 3 {
		t.Fatalf("deadletters -client alice: total %d, listed %d; want 3", dl.Total, len(dl.DeadLetters))
	}
	for i, d := range dl.DeadLetters {
		if d.ID != alice[i] || d.ClientID != "alice" || d.Reason != request.ReasonPermanent || d.LastStatus != 400 {
			t.Fatalf("dead letter %d = %+v, want alice's request %s, permanent, status 400", i, d, alice[i])
		}
	}
	s.ctlJSON(&dl, "deadletters", "-reason", string(request.ReasonAttemptsExhausted))
	if dl.Total != 0 {
		t.Fatalf("deadletters -reason attempts_exhausted: %d, want 0", dl.Total)
	}

	bare := s.ctl(2, "", "replay")
	mustContain(t, bare, "needs -all")
	if strings.Contains(bare, "matched") || strings.Contains(bare, "--all") {
		t.Fatalf("a bare replay is a usage error, with the flag as it is spelled; it said:\n%s", bare)
	}
	// Bodies and headers are shown only when asked for.
	if out := s.ctl(0, "", "deadletters", "-client", "alice"); strings.Contains(out, `"n":1`) {
		t.Fatalf("deadletters showed a body unasked:\n%s", out)
	}
	shown := s.ctl(0, "", "deadletters", "-id", alice[0], "-body")
	for _, want := range []string{`{"clientId":"alice","n":1}`, "Dispatch-Dead-Reason: permanent", "Dispatch-Id: " + alice[0], "1 shown of 1 selected"} {
		mustContain(t, shown, want)
	}
	var withBody struct {
		DeadLetters []admin.DeadLetterBody `json:"deadLetters"`
	}
	s.ctlJSON(&withBody, "deadletters", "-id", alice[0], "-body")
	if len(withBody.DeadLetters) != 1 || withBody.DeadLetters[0].Body == nil || *withBody.DeadLetters[0].Body != `{"clientId":"alice","n":1}` {
		t.Fatalf("deadletters -body -json: %+v, want alice's first body", withBody.DeadLetters)
	}
	mustContain(t, s.ctl(2, "", "replay", "-since", "yesterday"), "RFC 3339")
	mustContain(t, s.ctl(0, "", "replay", "-dry-run", "-client", "alice"), "3 matched, 3 would be requeued")
	if n := len(s.dead()); n != 5 {
		t.Fatalf("after a dry run the dead-letter stream holds %d, want still 5", n)
	}

	failing.Store(false) // raven is back
	s.markReplayed(append(alice, bob...)...)
	mustContain(t, s.ctl(0, "", "replay", "-id", bob[1]), "1 matched, 1 requeued")
	waitFor(t, time.Minute, "bob's second request to be delivered", func() bool { return s.deliveredIDs()[bob[1]] == 1 })
	mustContain(t, s.ctl(0, "", "replay", "-client", "alice", "-since", "1h"), "3 matched, 3 requeued")
	mustContain(t, s.ctl(0, "", "replay", "-all"), "1 matched, 1 requeued")
	mustContain(t, s.ctl(0, "", "replay", "-all"), "0 matched")

	rep := s.finish(20*time.Second, 0)
	if rep.Delivered != 5 || rep.Dead != 0 {
		t.Fatalf("delivered %d, dead %d; want every replayed request delivered once", rep.Delivered, rep.Dead)
	}
	// Raven saw the replayed requests under their own ids, so its idempotency holds.
	for _, id := range append(alice, bob...) {
		if s.deliveredIDs()[id] != 1 {
			t.Fatalf("request %s delivered %d times under its id, want 1", id, s.deliveredIDs()[id])
		}
	}
	// Spacing held across the failures and the replays (checked by finish), and the
	// replays came back in order within each client.
	var got []string
	for _, a := range s.arrivalsOf("alice") {
		if a.Status == 200 {
			got = append(got, a.ID)
		}
	}
	if !slices.Equal(got, alice) {
		t.Fatalf("alice's replayed requests arrived as %v, want %v", got, alice)
	}
}

func TestReplayInterruptedAndRunAgainQueuesEachOnce(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	failing.Store(true)
	s := newStack(t, options{respond: failWhile(&failing)})
	var ids []string
	for i := range 6 {
		ids = append(ids, s.post(clientName(i%2), i))
	}
	waitFor(t, time.Minute, "all six to be dead-lettered", func() bool { return len(s.dead()) == 6 })
	failing.Store(false)
	s.markReplayed(ids...)

	ctl, err := s.q.Control(context.Background(), testLog())
	if err != nil {
		t.Fatal(err)
	}
	svc, err := admin.New(admin.Config{Queue: s.q, Control: ctl, Log: testLog()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	rep, err := svc.Replay(ctx, queue.DeadFilter{}, true, false, func(admin.ReplayItem) {
		if n++; n == 3 {
			cancel() // the operator's terminal closes midway
		}
	})
	if err == nil || rep.Requeued != 3 {
		t.Fatalf("interrupted replay: report %+v, err %v; want 3 requeued and an error", rep, err)
	}
	if left := len(s.dead()); left != 3 {
		t.Fatalf("after the interruption %d dead letters are left, want 3", left)
	}
	mustContain(t, s.ctl(0, "", "replay", "-all"), "3 matched, 3 requeued")
	s.finish(20*time.Second, 0) // each delivered exactly once: no duplicates allowed
	if d := s.deliveredIDs(); len(d) != 6 {
		t.Fatalf("%d distinct requests delivered, want 6", len(d))
	}
}

func TestReplayJoinsTheBackOfItsClientsBacklog(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	failing.Store(true)
	s := newStack(t, options{respond: failWhile(&failing)})
	first := s.post("carol", 0)
	waitFor(t, time.Minute, "carol's first request to be dead-lettered", func() bool { return s.dead()[first] })
	failing.Store(false)

	s.ctl(0, "", "pause", "carol") // hold a backlog in place
	later := []string{s.post("carol", 1), s.post("carol", 2), s.post("carol", 3)}
	s.markReplayed(first)
	mustContain(t, s.ctl(0, "", "replay", "-id", first), "1 requeued")
	s.ctl(0, "", "resume", "carol")
	s.finish(20*time.Second, 0)

	var got []string
	for _, a := range s.arrivalsOf("carol")[1:] { // after the failed first attempt
		got = append(got, a.ID)
	}
	if want := append(later, first); !slices.Equal(got, want) {
		t.Fatalf("carol's arrivals after the replay: %v, want the backlog first and the replay last: %v", got, want)
	}
}

func TestPausedClientWaitsThenGoesAtTheSpacedRate(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{interval: 150 * time.Millisecond})
	mustContain(t, s.ctl(0, "", "pause", "dave"), "paused dave: nothing is queued for it now")
	mustContain(t, s.ctl(0, "", "pause", "dave"), "dave was paused already; nothing changed")
	mustContain(t, s.ctl(0, "", "resume", "frank"), "frank was not paused; nothing changed")
	// The pause reaches the dispatcher through its watch of the control bucket: dave posts
	// once it has.
	waitFor(t, time.Minute, "the dispatcher to apply dave's pause", func() bool {
		return len(logLines(s.dispatchLog.String(), "client steering changed")) >= 1
	})
	for i := range 4 {
		s.post("dave", i)
	}
	s.post("erin", 0)
	s.post("erin", 1)
	waitFor(t, time.Minute, "erin's requests to be delivered", func() bool { return len(s.arrivalsOf("erin")) == 2 })
	time.Sleep(5 * s.opts.interval) // a paused client's sends would have come by now (a slow machine only hides them)
	if n := len(s.arrivalsOf("dave")); n != 0 {
		t.Fatalf("paused dave got %d sends", n)
	}

	// A dispatcher that answers later than the lane wait is left out of an answer: read
	// again until dave's lane is in it.
	var page admin.ClientsPage
	waitForState(t, time.Minute, "a clients page with dave's lane", func() (bool, string) {
		s.ctlJSON(&page, "clients")
		return len(page.Clients) == 1 && page.Clients[0].Lane != "none", fmt.Sprintf("%+v", page.Clients)
	})
	if len(page.Clients) != 1 || page.Clients[0].ClientID != "dave" || page.Clients[0].Backlog != 4 ||
		page.Clients[0].Lane != "paused" || page.Clients[0].Steering == nil || !page.Clients[0].Steering.Paused {
		t.Fatalf("clients while dave is paused: %+v, want dave alone with 4 queued and a paused lane", page.Clients)
	}

	// Its backlog is counted just after the resume is written: a dispatcher may have
	// sent one already.
	mustContain(t, s.ctl(0, "", "resume", "dave"), "resumed dave: its ")
	resumed := time.Now()    // once dispatchctl is done: its start is not the dispatcher's to answer for
	s.finish(time.Minute, 0) // spacing and order checked here
	// The dispatcher logged each change once, saying who made it: the pause and the
	// resume, not the pause that changed nothing, nor frank's resume.
	changes := logLines(s.dispatchLog.String(), "client steering changed")
	byCtl := func(m map[string]any) bool { by, _ := m["by"].(string); return strings.HasPrefix(by, "dispatchctl ") }
	if len(changes) != 2 || changes[0]["client_id"] != "dave" || changes[0]["now"] != "paused" || !byCtl(changes[0]) ||
		changes[1]["now"] != "none" || !byCtl(changes[1]) {
		t.Fatalf("dispatcher logged steering changes %v, want dave's pause then resume, each with by", changes)
	}
	as := s.arrivalsOf("dave")
	if len(as) != 4 {
		t.Fatalf("dave got %d sends after resuming, want 4", len(as))
	}
	// A resume takes effect when it is written, not at some later look at paused lanes
	// (the resync every 30 s): the bound is the watch and a send, with room for a loaded
	// machine, and still a third of the resync's period.
	if lag := as[0].Start.Sub(resumed); lag > 10*time.Second {
		t.Fatalf("first send came %s after the resume, want within a few seconds", lag)
	}
}

// gapsOf returns the start-to-start gaps between client's consecutive arrivals.
func gapsOf(as []ledger.Arrival) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(as); i++ {
		out = append(out, as[i].Start.Sub(as[i-1].Start))
	}
	return out
}

// Intervals set at runtime: a global one reaches the running dispatcher (it logs the
// change, and frank's gaps follow it), a per-client one survives a restart, and setting the
// global one back to default gives the others the configured interval again. The intervals
// are seconds apart in scale, so that a slow machine cannot make one look like another.
func TestIntervalChangesReachARunningDispatcherAndSurviveARestart(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{interval: 100 * time.Millisecond})
	s.post("frank", 0)
	waitFor(t, time.Minute, "frank's first request", func() bool { return len(s.arrivalsOf("frank")) == 1 })

	var st admin.Steered
	s.ctlJSON(&st, "steering")
	if st.GlobalInterval != "default" {
		t.Fatalf("steering shows global interval %q before any was set, want default", st.GlobalInterval)
	}
	s.ctl(0, "", "interval", "3s")
	s.ctlJSON(&st, "steering")
	if st.GlobalInterval != "3s" {
		t.Fatalf("steering shows global interval %q, want 3s", st.GlobalInterval)
	}
	waitFor(t, time.Minute, "the dispatcher to log the change with who made it", func() bool {
		return len(logLines(s.dispatchLog.String(), "global interval changed")) == 1
	})
	if by, _ := logLines(s.dispatchLog.String(), "global interval changed")[0]["by"].(string); !strings.HasPrefix(by, "dispatchctl ") {
		t.Fatalf("the global change was logged by %q, want dispatchctl's operator", by)
	}
	for i := range 2 {
		s.post("frank", i+1)
	}
	waitFor(t, time.Minute, "frank's next two", func() bool { return len(s.arrivalsOf("frank")) == 3 })
	for _, g := range gapsOf(s.arrivalsOf("frank")[1:]) {
		if g < 3*time.Second {
			t.Fatalf("gap %s after the global interval went to 3s", g)
		}
	}

	// A per-client interval, then a restart: the new dispatcher reads it from the bucket.
	// Everything is queued before it starts, so that only the intervals space the sends.
	s.ctl(0, "", "interval", "default")
	s.ctl(0, "", "client-interval", "grace", "5s")
	s.stopDispatcher()
	for i := range 3 {
		s.post("grace", i)
		s.post("heidi", i)
	}
	s.startDispatcher()
	s.finish(time.Minute, 0)
	for _, g := range gapsOf(s.arrivalsOf("grace")) {
		if g < 5*time.Second {
			t.Fatalf("grace: gap %s under her own 5s interval after a restart", g)
		}
	}
	heidi := gapsOf(s.arrivalsOf("heidi"))
	// Under the 3 s global interval every gap would be 3 s or more (G2); under her 100 ms
	// one at least one is shorter, even when a loaded machine stretches the other.
	if len(heidi) != 2 || slices.Min(heidi) >= 3*time.Second {
		t.Fatalf("heidi's gaps %v: want the configured interval (100ms) back, under the 3s global one that was set back to default", heidi)
	}
	// The kept gap reads against each client's interval in force, whatever it was
	// configured to at start: 5 s gaps and 100 ms gaps alike sit at 1x and above.
	m := gather(t, s.metrics)
	if n := metric(t, m, `dispatch_send_gap_ratio_count`); n < 4 {
		t.Errorf("dispatch_send_gap_ratio counted %v gaps, want grace's and heidi's", n)
	}
	if n := metric(t, m, `dispatch_send_gap_ratio_bucket{le="0.99"}`); n != 0 {
		t.Errorf("%v gaps under 0.99 of the interval in force", n)
	}
	if n := metric(t, m, `dispatch_send_gaps_below_interval_total`); n != 0 {
		t.Errorf("dispatch_send_gaps_below_interval_total = %v, want 0", n)
	}
}

func TestPurgeMovesTheBacklogToDeadLettersNeverDeletes(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{})
	s.ctl(0, "", "pause", "ivan")
	// The pause reaches the dispatcher through its watch of the control bucket: ivan posts
	// once it has (on a loaded machine his first request once went out before it).
	waitFor(t, time.Minute, "the dispatcher to apply ivan's pause", func() bool {
		return len(logLines(s.dispatchLog.String(), "client steering changed")) >= 1
	})
	var ids []string
	for i := range 5 {
		ids = append(ids, s.post("ivan", i))
	}
	mustContain(t, s.ctl(2, "not-ivan\n", "purge", "ivan"), "not confirmed")
	if n := s.queued(); n != 5 {
		t.Fatalf("after an unconfirmed purge %d are queued, want 5", n)
	}

	var res admin.PurgeResult
	s.ctlJSON(&res, "purge", "-yes", "ivan")
	if res.Requests != 5 || res.Remaining != 0 {
		t.Fatalf("purge: %+v, want 5 requests moved, none remaining", res)
	}
	var dl deadList
	s.ctlJSON(&dl, "deadletters", "-client", "ivan", "-reason", string(request.ReasonPurged))
	if dl.Total != 5 {
		t.Fatalf("%d purged dead letters for ivan, want 5", dl.Total)
	}
	for i, d := range dl.DeadLetters {
		if d.ID != ids[i] || d.Attempts != 0 {
			t.Fatalf("purged dead letter %d: %+v, want %s in order, never attempted", i, d, ids[i])
		}
	}
	// A request accepted after the purge is not touched; ivan is still paused.
	late := s.post("ivan", 99)
	var st admin.Steered
	s.ctlJSON(&st, "steering")
	if c := st.Clients["ivan"]; !c.Paused || c.PurgeThrough != 0 {
		t.Fatalf("ivan's steering after the purge: %+v, want paused with the purge mark cleared", c)
	}
	s.ctl(0, "", "resume", "ivan")
	s.finish(time.Minute, 0)
	as := s.arrivalsOf("ivan")
	if len(as) != 1 || as[0].ID != late {
		t.Fatalf("ivan's arrivals %v, want only the request accepted after the purge", as)
	}

	// A purge of a client that is sending: what was not yet sent goes to the dead-letter
	// stream, nothing is both sent and dead-lettered (finish checks), nothing is lost.
	// judy's 10 requests take 18 s at her 2 s interval: the purge comes long before the
	// last, however slow dispatchctl is to start.
	s.ctl(0, "", "client-interval", "judy", "2s")
	s.startDispatcher()
	for i := range 10 {
		s.post("judy", i)
	}
	waitFor(t, time.Minute, "judy's sends to begin", func() bool { return len(s.arrivalsOf("judy")) >= 2 })
	s.ctlJSON(&res, "purge", "-yes", "judy")
	if res.Remaining != 0 {
		t.Fatalf("purge of a sending client: %+v", res)
	}
	s.finish(time.Minute, 0)
	if sent := len(s.arrivalsOf("judy")); sent < 2 || sent == 10 {
		t.Fatalf("judy got %d sends; the purge should have come while she was sending", sent)
	}
}

// What dispatchctl shows of clients and requests: a snapshot taken while nothing can have
// been sent (the start-up fence is a 30 s interval, lowered once the snapshot is read),
// then a request held in flight by raven until dispatchctl has seen it there, a
// dead-lettered one and a delivered one.
func TestInspectClientsAndRequests(t *testing.T) {
	t.Parallel()
	leeSeen := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(leeSeen) }) }
	s := newStack(t, options{interval: 30 * time.Second, timeout: 5 * time.Minute, respond: func(a ledger.Arrival) ledger.Response {
		switch a.ClientID {
		case "kim":
			return ledger.Response{Status: 400}
		case "lee":
			<-leeSeen
		}
		return ledger.Response{}
	}})
	t.Cleanup(release) // registered after the stack's: runs before raven is closed
	kim := s.post("kim", 0)
	lee := s.post("lee", 0)
	var ivy []string
	for i := range 3 {
		ivy = append(ivy, s.post("ivy", i))
	}
	s.post("jon", 0)

	// A dispatcher that answers later than the lane wait is left out of an answer: read
	// again until ivy's lane is in it.
	var page admin.ClientsPage
	waitForState(t, time.Minute, "a clients page with ivy's lane", func() (bool, string) {
		s.ctlJSON(&page, "clients")
		return len(page.Clients) > 0 && page.Clients[0].Lane != "none", fmt.Sprintf("%+v", page)
	})
	if page.Total != 4 || page.Clients[0].ClientID != "ivy" || page.Clients[0].Backlog != 3 {
		t.Fatalf("clients: %+v, want 4 with ivy first (3 queued)", page)
	}
	c := page.Clients[0]
	if c.Lane != "waiting" || c.NextSend.IsZero() || c.Interval != "30s" || c.Dispatcher != "test" || c.OldestAge == "" {
		t.Fatalf("ivy: %+v, want a waiting lane on the test dispatcher with a next send and the 30s interval", c)
	}
	s.ctlJSON(&page, "clients", "-sort", "age", "-limit", "1", "-page", "2")
	if page.Total != 4 || len(page.Clients) != 1 || page.Clients[0].ClientID != "lee" {
		t.Fatalf("clients by age, page 2 of 1: %+v, want lee (accepted second)", page.Clients)
	}
	mustContain(t, s.ctl(2, "", "clients", "-sort", "size"), "sort")

	var rs admin.RequestState
	s.ctlJSON(&rs, "request", "-client", "ivy", ivy[2])
	if rs.State != admin.StateQueued || rs.Position == nil || *rs.Position != 2 || rs.ClientID != "ivy" {
		t.Fatalf("request %s: %+v, want queued with 2 ahead", ivy[2], rs)
	}
	waitForState(t, time.Minute, "ivy's head request with its lane", func() (bool, string) {
		s.ctlJSON(&rs, "request", ivy[0])
		return rs.Lane != nil, fmt.Sprintf("%+v", rs)
	})
	if rs.State != admin.StateQueued {
		t.Fatalf("request %s: %+v, want queued at the head with its lane", ivy[0], rs)
	}

	// The snapshot is read: a 1 s interval lets everything go. The ledger judges the gaps
	// by it (every gap before the change was 30 s or more).
	s.ctl(0, "", "interval", "1s")
	s.opts.interval = time.Second
	waitForState(t, time.Minute, "lee's request to be in flight", func() (bool, string) {
		s.ctlJSON(&rs, "request", lee)
		return rs.State == admin.StateInFlight, fmt.Sprintf("%+v", rs)
	})
	release()
	waitFor(t, time.Minute, "kim's request to be dead-lettered", func() bool { return s.dead()[kim] })
	s.ctlJSON(&rs, "request", kim)
	if rs.State != admin.StateDeadLettered || rs.DeadLetter == nil || rs.DeadLetter.Reason != request.ReasonPermanent {
		t.Fatalf("request %s: %+v, want dead-lettered as permanent", kim, rs)
	}
	waitFor(t, time.Minute, "lee's request to be delivered", func() bool { return s.deliveredIDs()[lee] == 1 })
	// Who sent it comes from the dispatchers' answers, within the lane wait (300 ms): a
	// loaded machine's dispatcher may answer later, and the request is read again.
	waitForState(t, time.Minute, "lee's request read as delivered, with who sent it", func() (bool, string) {
		rs = admin.RequestState{}
		s.ctlJSON(&rs, "request", lee)
		return rs.State == admin.StateDelivered && rs.Delivery != nil && rs.Dispatcher != "", fmt.Sprintf("%+v", rs)
	})
	if rs.ClientID != "lee" || rs.Dispatcher != "test" || rs.Delivery.Attempt != 1 {
		t.Fatalf("delivered request %s: %+v, want sent by the test dispatcher on attempt 1", lee, rs)
	}
	if out := s.ctl(0, "", "request", lee); strings.Contains(out, "0001-01-01") {
		t.Fatalf("request %s printed a zero time:\n%s", lee, out)
	}
	mustContain(t, s.ctl(0, "", "request", "NO-SUCH-ID"), "unknown")
	mustContain(t, s.ctl(2, "", "request"), "expected")
	mustContain(t, s.ctl(2, "", "nonsense"), "unknown command")
	mustContain(t, s.ctl(0, "", "-h"), "replay")
	s.finish(time.Minute, 0)
}
