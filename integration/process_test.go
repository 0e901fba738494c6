package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/penguinhq/dispatcher/integration/itest"
	"github.com/penguinhq/dispatcher/pkg/ledger"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
)

var dispatcherBin, ingestBin, ctlBin, natsnodeBin string

func TestMain(m *testing.M) {
	dir, err := itest.BuildBinaries("dispatcher", "ingest", "dispatchctl", "natsnode")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dispatcherBin, ingestBin, ctlBin = filepath.Join(dir, "dispatcher"), filepath.Join(dir, "ingest"), filepath.Join(dir, "dispatchctl")
	natsnodeBin = filepath.Join(dir, "natsnode")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a service binary running as its own OS process (itest.Proc, which the soak
// runs its processes with too), failing its test when a signal cannot be sent.
type proc struct {
	*itest.Proc
	t testing.TB
}

func startProc(t testing.TB, env map[string]string, args ...string) *proc {
	t.Helper()
	return startBin(t, dispatcherBin, env, args...)
}

// startBin starts bin; its operators' listener is on any free port unless env gives one
// (tests run side by side). It is killed when the test ends, and its output printed if
// the test failed.
func startBin(t testing.TB, bin string, env map[string]string, args ...string) *proc {
	t.Helper()
	ip, err := itest.Start(itest.Spec{Bin: bin, Args: args, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{Proc: ip, t: t}
	t.Cleanup(func() {
		p.signal(syscall.SIGKILL)
		if t.Failed() {
			t.Logf("output of pid %d:\n%s", p.Pid(), p.Output())
		}
	})
	return p
}

// send sends sig and returns at once (SIGSTOP, SIGCONT).
func (p *proc) send(sig syscall.Signal) {
	p.t.Helper()
	if err := p.Signal(sig); err != nil {
		p.t.Fatalf("sending %s to pid %d: %v", sig, p.Pid(), err)
	}
}

// signal sends sig and waits for the process to exit.
func (p *proc) signal(sig syscall.Signal) {
	if !p.Stop(sig, 30*time.Second) {
		p.t.Errorf("pid %d did not exit within 30s of %s", p.Pid(), sig)
	}
}

// The dispatcher process is killed with SIGKILL while a send is in flight and started
// again: nothing is lost, order holds, and the spacing holds across the restart because a
// starting dispatcher waits one interval before its first send (G2, G3, G4, G5).
func TestDispatcherKilledMidSendAndRestarted(t *testing.T) {
	t.Parallel()
	const interval = 300 * time.Millisecond
	var started atomic.Int32
	arrived := make(chan struct{}, 1000)
	killed := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(killed) }) }
	s := newStack(t, options{interval: interval, noStart: true, respond: func(ledger.Arrival) ledger.Response {
		if started.Add(1) == 6 {
			// Raven holds the 6th request until the dispatcher that sent it is dead: the
			// kill lands mid-send however slow the machine, and the held answer then
			// finds its sender gone.
			arrived <- struct{}{}
			<-killed
			return ledger.Response{Delay: time.Minute}
		}
		arrived <- struct{}{}
		return ledger.Response{}
	}})
	t.Cleanup(release) // registered after the stack's: runs before raven is closed
	const clients, each = 4, 6
	for c := range clients {
		for n := range each {
			s.post(clientName(c), n)
		}
	}
	env := map[string]string{"NATS_URL": s.srv.ClientURL(), "RAVEN_URL": s.ravenURL, "DISPATCH_INTERVAL": interval.String(),
		"LEASE_TTL": "6s", "RAVEN_TIMEOUT": "3s"}
	p := startProc(t, env)
	for range 6 {
		select {
		case <-arrived:
		case <-p.Done():
			t.Fatalf("the dispatcher exited after %d arrivals; output:\n%s", started.Load(), p.Output())
		case <-time.After(60 * time.Second):
			t.Fatalf("only %d arrivals before the kill; output:\n%s", started.Load(), p.Output())
		}
	}
	p.signal(syscall.SIGKILL) // raven is holding the 6th request: the kill lands mid-send
	before := started.Load()
	release()

	p2 := startProc(t, env)
	rep := s.finish(60*time.Second, clients)
	p2.signal(syscall.SIGTERM)

	aborted := 0
	for _, a := range s.ledger.Arrivals() {
		if a.Aborted {
			aborted++
		}
	}
	if aborted == 0 {
		t.Fatal("no attempt was cut off by the kill; the test did not exercise a crash mid-send")
	}
	if rep.Delivered != clients*each || int(started.Load()) <= int(before) {
		t.Fatalf("delivered %d of %d; %d arrivals before the kill, %d in all", rep.Delivered, clients*each, before, started.Load())
	}
}

// The standalone process is stopped with a backlog on disk and started again on the same
// DATA_DIR: the backlog survives and drains, spaced and in order. Once with SIGTERM (a
// graceful drain) and once with SIGKILL (a crash; the embedded server fsyncs every write).
func TestStandaloneRestartWithBacklog(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			// A 1 s interval: the backlog takes seconds to drain, so that posting it on a
			// loaded machine does not race its delivery.
			const interval = time.Second
			s := newStack(t, options{interval: interval, noStart: true})
			dataDir := t.TempDir()
			ingestAddr, natsAddr := freeAddr(t), freeAddr(t)
			env := map[string]string{
				"DATA_DIR": dataDir, "INGEST_ADDR": ingestAddr, "NATS_LISTEN": natsAddr,
				"RAVEN_URL": s.ravenURL, "DISPATCH_INTERVAL": interval.String(),
			}
			p := startProc(t, env, "-standalone")
			base := "http://" + ingestAddr
			waitReady(t, base)
			s.useQueueAt("nats://" + natsAddr)
			s.ingestURL = base + "/v1/requests"
			const clients, each = 3, 6
			for c := range clients {
				for n := range each {
					s.post(clientName(c), n)
				}
			}
			waitFor(t, time.Minute, "a few deliveries", func() bool { return s.ledger.Delivered() >= 4 })
			p.signal(sig)
			if sig == syscall.SIGTERM && p.ExitCode() != 0 {
				t.Fatalf("standalone exited %d on SIGTERM, want 0; output:\n%s", p.ExitCode(), p.Output())
			}
			left := clients*each - s.ledger.Delivered()
			if left < clients {
				t.Fatalf("only %d requests left at the restart; the test needs a backlog", left)
			}
			restarted := time.Now()
			startProc(t, env, "-standalone")
			s.finish(60*time.Second, clients)
			after := 0
			for _, a := range s.ledger.Arrivals() {
				if a.Start.After(restarted) {
					after++
				}
			}
			if after < left {
				t.Fatalf("%d arrivals after the restart, want at least the %d left on disk", after, left)
			}
		})
	}
}

// useQueueAt points the stack's queue view at another NATS server (a process's own).
func (s *stack) useQueueAt(url string) {
	s.t.Helper()
	nc := connectTo(s.t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q, err := queue.Open(ctx, nc, queue.Config{}, queue.Existing)
	if err != nil {
		s.t.Fatalf("opening queue at %s: %v", url, err)
	}
	s.nc, s.q = nc, q
}

// The two binaries run on their own against an external NATS, as in production: requests
// posted to cmd/ingest reach raven through cmd/dispatcher.
func TestBinariesAgainstExternalNATS(t *testing.T) {
	t.Parallel()
	const interval = 200 * time.Millisecond
	s := newStack(t, options{interval: interval, noStart: true})
	addr := freeAddr(t)
	common := map[string]string{"NATS_URL": s.srv.ClientURL(), "DISPATCH_INTERVAL": interval.String()}
	startBin(t, ingestBin, map[string]string{"NATS_URL": common["NATS_URL"], "INGEST_ADDR": addr})
	startProc(t, map[string]string{"NATS_URL": common["NATS_URL"], "RAVEN_URL": s.ravenURL, "DISPATCH_INTERVAL": interval.String(),
		"LEASE_TTL": "2s", "RAVEN_TIMEOUT": "1s"})
	waitReady(t, "http://"+addr)
	s.ingestURL = "http://" + addr + "/v1/requests"
	for c := range 3 {
		for n := range 4 {
			s.post(clientName(c), n)
		}
	}
	if rep := s.finish(30*time.Second, 0); rep.Delivered != 12 {
		t.Fatalf("delivered %d, want 12", rep.Delivered)
	}
}

// With EVENTS=false, ingest and the dispatcher neither create nor need the events
// stream: removed (an operator freeing its disk), both stay ready, and requests are
// taken and delivered.
func TestEventsOffNeedsNoEventsStream(t *testing.T) {
	t.Parallel()
	const interval = 200 * time.Millisecond
	s := newStack(t, options{interval: interval, noStart: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(s.nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, queue.EventStream); err != nil {
		t.Fatalf("removing the events stream: %v", err)
	}
	ingestAddr, ingestOps, dispOps := freeAddr(t), freeAddr(t), freeAddr(t)
	startBin(t, ingestBin, map[string]string{"NATS_URL": s.srv.ClientURL(), "INGEST_ADDR": ingestAddr, "OPS_ADDR": ingestOps, "EVENTS": "false"})
	startProc(t, map[string]string{"NATS_URL": s.srv.ClientURL(), "RAVEN_URL": s.ravenURL, "DISPATCH_INTERVAL": interval.String(),
		"LEASE_TTL": "2s", "RAVEN_TIMEOUT": "1s", "OPS_ADDR": dispOps, "EVENTS": "false"})
	// Both have opened the queue once their listeners answer.
	waitReady(t, "http://"+ingestAddr)
	waitFor(t, time.Minute, "the dispatcher's listener", func() bool {
		resp, err := testHTTP.Get("http://" + dispOps + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})
	if _, err := js.Stream(ctx, queue.EventStream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("a process with EVENTS=false made the events stream again (%v); removing it again", err)
		if err := js.DeleteStream(ctx, queue.EventStream); err != nil {
			t.Fatalf("removing the events stream: %v", err)
		}
	}
	for _, ops := range []string{ingestOps, dispOps} {
		var last string
		ready := func() bool {
			resp, err := testHTTP.Get("http://" + ops + "/readyz")
			if err != nil {
				last = err.Error()
				return false
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			last = fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(body))
			return resp.StatusCode == http.StatusOK
		}
		deadline := time.Now().Add(15 * time.Second)
		for !ready() && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if !strings.HasPrefix(last, "200") {
			t.Errorf("%s/readyz with EVENTS=false and no events stream: %s, want 200", ops, last)
		}
	}
	s.ingestURL = "http://" + ingestAddr + "/v1/requests"
	for n := range 3 {
		s.post("eve", n)
	}
	if rep := s.finish(30*time.Second, 0); rep.Delivered != 3 {
		t.Fatalf("delivered %d, want 3", rep.Delivered)
	}
}

// Standalone without RAVEN_URL starts a demo raven, says where, and logs each arrival with
// the gap since that client's previous one.
func TestStandaloneDemoRaven(t *testing.T) {
	t.Parallel()
	const interval = 300 * time.Millisecond
	ingestAddr, demoAddr := freeAddr(t), freeAddr(t)
	p := startProc(t, map[string]string{"DATA_DIR": t.TempDir(), "INGEST_ADDR": ingestAddr, "DEMO_RAVEN_ADDR": demoAddr,
		"DISPATCH_INTERVAL": interval.String()}, "-standalone")
	s := &stack{t: t, ingestURL: "http://" + ingestAddr + "/v1/requests", http: apiClient(t)}
	waitReady(t, "http://"+ingestAddr)
	for n := range 3 {
		s.post("alice", n)
	}
	s.post("bob", 0)
	var lines []map[string]any
	waitFor(t, time.Minute, "four arrivals logged by the demo raven", func() bool {
		lines = logLines(p.Output(), "raven received")
		return len(lines) >= 4
	})
	if said := logLines(p.Output(), "demo raven listening"); len(said) != 1 || said[0]["url"] != "http://"+demoAddr+"/" {
		t.Fatalf("the demo raven did not say where it listens: %v", said)
	}
	gaps := map[string][]any{}
	for _, l := range lines {
		c, _ := l["client_id"].(string)
		gaps[c] = append(gaps[c], l["gap_ms"])
	}
	if len(gaps["alice"]) != 3 || gaps["alice"][0] != "first" || len(gaps["bob"]) != 1 || gaps["bob"][0] != "first" {
		t.Fatalf("logged gaps %v, want alice's first and two gaps, bob's first", gaps)
	}
	for _, g := range gaps["alice"][1:] {
		if ms, ok := g.(float64); !ok || ms < float64(interval.Milliseconds()) {
			t.Fatalf("alice's logged gap %v, want at least %d ms", g, interval.Milliseconds())
		}
	}
}

// logLines returns the JSON log lines of out whose message starts with msg.
func logLines(out, msg string) []map[string]any {
	return itest.LogLines(strings.NewReader(out), msg)
}

// waitReady waits until the ingest API at base answers readyz with 200.
// A service started before NATS waits for it instead of exiting; ingest then waits for a
// dispatcher to create the streams, and becomes ready once one has.
func TestIngestWaitsForNATS(t *testing.T) {
	t.Parallel()
	natsAddr, ingestAddr := freeAddr(t), freeAddr(t)
	p := startBin(t, ingestBin, map[string]string{"NATS_URL": "nats://" + natsAddr, "INGEST_ADDR": ingestAddr})
	// It failed to reach NATS and said it will try again (a process that gives up exits
	// instead), then NATS starts.
	waitFor(t, time.Minute, "ingest to fail to reach NATS and retry", func() bool {
		return strings.Contains(p.Output(), "not reachable yet; retrying") || p.Exited()
	})
	select {
	case <-p.Done():
		t.Fatalf("ingest exited while NATS was not up yet; output:\n%s", p.Output())
	default:
	}
	queuetest.ServerAt(t, t.TempDir(), natsAddr)
	// NATS is there, the streams are not: ingest creates none (its NATS user may not) and
	// waits for a dispatcher to, not ready.
	waitFor(t, time.Minute, "ingest to find the streams missing and wait", func() bool {
		return strings.Contains(p.Output(), "start a dispatcher once to create the streams") || p.Exited()
	})
	if p.Exited() {
		t.Fatalf("ingest exited while the streams were missing; output:\n%s", p.Output())
	}
	if code := status("http://" + ingestAddr + "/readyz"); code == http.StatusOK {
		t.Fatal("ingest is ready before any stream exists")
	}
	startProc(t, map[string]string{"NATS_URL": "nats://" + natsAddr, "RAVEN_URL": "http://127.0.0.1:9/"})
	waitReady(t, "http://"+ingestAddr)
}
