// Package compose tests the docker-compose stack end to end. It is a package of its own
// so that it runs beside the other integration tests, not after them: it mostly waits on
// Docker.
package compose

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/integration/itest"
	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/ledger"
)

var (
	waitFor     = itest.WaitFor
	waitReady   = itest.WaitReady
	freeAddr    = itest.FreeAddr
	mustContain = itest.MustContain
	clientName  = itest.ClientName
	scrapeQuiet = itest.ScrapeQuiet
)

// ctlBin is dispatchctl, built by TestMain.
var ctlBin string

func TestMain(m *testing.M) {
	dir, err := itest.BuildBinaries("dispatchctl")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctlBin = filepath.Join(dir, "dispatchctl")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// composeCmd is how to run Compose here: the docker-compose tool, or the docker CLI's
// compose plugin; nil when neither is there.
func composeCmd() []string {
	if _, err := exec.LookPath("docker-compose"); err == nil {
		return []string{"docker-compose"}
	}
	if exec.Command("docker", "compose", "version").Run() == nil {
		return []string{"docker", "compose"}
	}
	return nil
}

// composeStack is the repository's docker-compose.yml brought up under its own project
// name and host ports.
type composeStack struct {
	t       *testing.T
	cmd     []string
	root    string
	project string
	env     []string
	envFile string // empty: an operator's .env beside the compose file must not steer the test
	ports   map[string]string
}

func (c *composeStack) run(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	full := append(append(append([]string{}, c.cmd[1:]...), "-p", c.project, "-f", filepath.Join(c.root, "docker-compose.yml"),
		"--env-file", c.envFile), args...)
	cmd := exec.CommandContext(ctx, c.cmd[0], full...)
	cmd.Dir, cmd.Env = c.root, c.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (c *composeStack) must(timeout time.Duration, args ...string) {
	c.t.Helper()
	if out, err := c.run(timeout, args...); err != nil {
		c.t.Fatalf("compose %v: %v\n%s", args, err, out)
	}
}

// healthy says whether service's container reports healthy.
func (c *composeStack) healthy(service string) bool {
	id, err := c.run(time.Minute, "ps", "-q", service)
	if err != nil || strings.TrimSpace(id) == "" {
		return false
	}
	out, err := exec.Command("docker", "inspect", "-f", "{{.State.Health.Status}}", strings.TrimSpace(id)).Output()
	return err == nil && strings.TrimSpace(string(out)) == "healthy"
}

// removeStaleStacks takes down what an earlier run of this test left behind (a run
// killed by a timeout does not clean up). A stack whose test process still runs is not
// stale: two CI runs side by side each keep their own.
func removeStaleStacks(t testing.TB, c *composeStack) {
	out, err := exec.Command("docker", "ps", "-a", "--format", `{{.Label "com.docker.compose.project"}}`).Output()
	if err != nil {
		return
	}
	seen := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "dispatche2e") && p != c.project && !seen[p] && !processRuns(strings.TrimPrefix(p, "dispatche2e")) {
			seen[p] = true
			stale := *c
			stale.project = p
			if out, err := stale.run(2*time.Minute, "down", "-v", "--remove-orphans", "-t", "1"); err != nil {
				t.Logf("removing stale stack %s: %v\n%s", p, err, out)
			}
		}
	}
}

// processRuns reports whether the process with this id (a decimal pid) is alive here.
func processRuns(pid string) bool {
	if _, err := strconv.Atoi(pid); err != nil {
		return false
	}
	_, err := os.Stat("/proc/" + pid)
	return err == nil
}

func (c *composeStack) url(port, path string) string {
	return "http://127.0.0.1:" + c.ports[port] + path
}

// The compose stack as operators run it: images built with no registry, a 3-node NATS
// cluster, two ingest and two dispatcher containers, the demo raven recording. Requests
// for several clients go in through both ingests while one dispatcher container and one
// NATS container are killed and brought back; at the end the demo raven's record shows
// nothing lost, order kept, and no gap under the interval.
func TestComposeStackSurvivesKilledContainers(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the compose end-to-end test builds images and takes a few minutes")
	}
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skip("no docker CLI here: the compose end-to-end test needs a Docker engine")
	}
	if out, err := exec.Command("docker", "info").CombinedOutput(); err != nil {
		t.Skipf("no Docker engine reachable (docker info: %v): the compose end-to-end test needs one\n%s", err, out)
	}
	cmd := composeCmd()
	if cmd == nil {
		t.Skip("Docker is here but neither docker-compose nor the docker compose plugin: the compose end-to-end test needs one")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	const tag, interval = "e2e", 500 * time.Millisecond
	build := exec.Command("bash", filepath.Join(root, "deployments", "images.sh"))
	build.Env = append(os.Environ(), "IMAGE_TAG="+tag)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make images: %v\n%s", err, out)
	}

	const token = "e2e-ingest-token-0123456789abcdef"
	c := &composeStack{t: t, cmd: cmd, root: root, project: fmt.Sprintf("dispatche2e%d", os.Getpid()), ports: map[string]string{},
		envFile: filepath.Join(t.TempDir(), "empty.env")}
	if err := os.WriteFile(c.envFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	removeStaleStacks(t, c)
	// Everything the stack reads is set here: nothing comes from the operator's shell.
	c.env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "DOCKER_HOST=" + os.Getenv("DOCKER_HOST"),
		"IMAGE_TAG=" + tag, "DISPATCH_INTERVAL=" + interval.String(), "RECORD_ARRIVALS=true",
		"LEASE_TTL=4s", "RAVEN_TIMEOUT=1s", "PARTITIONS=16", "RAVEN_URL=http://demoraven:8081/", "ADMIN_TOKEN=",
		"INGEST_TOKEN=" + token, "INGEST_NATS_PASSWORD=e2e-i", "DISPATCHER_NATS_PASSWORD=e2e-d", "OPS_NATS_PASSWORD=e2e-o",
		"SYS_NATS_PASSWORD=e2e-s"}
	for _, p := range []string{"INGEST_PORT", "INGEST2_PORT", "INGEST_OPS_PORT", "INGEST2_OPS_PORT", "RAVEN_PORT", "NATS_PORT", "NATS2_PORT",
		"NATS3_PORT", "DISPATCHER_OPS_PORT", "DISPATCHER2_OPS_PORT"} {
		addr := freeAddr(t)
		c.ports[p] = addr[strings.LastIndexByte(addr, ':')+1:]
		c.env = append(c.env, p+"="+c.ports[p])
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := c.run(time.Minute, "logs", "--no-color", "--tail", "60")
			t.Logf("compose logs:\n%s", out)
		}
		if out, err := c.run(3*time.Minute, "down", "-v", "--remove-orphans", "-t", "5"); err != nil {
			t.Errorf("compose down: %v\n%s", err, out)
		}
	})
	c.must(5*time.Minute, "up", "-d")
	for _, p := range []string{"INGEST_PORT", "INGEST2_PORT", "INGEST_OPS_PORT", "INGEST2_OPS_PORT", "DISPATCHER_OPS_PORT", "DISPATCHER2_OPS_PORT"} {
		waitReady(t, c.url(p, ""))
	}
	c.operatorsFirstLook(t)

	// Penguin: 6 clients, 10 requests each, spread over both ingests and about 8 s, each
	// with an Idempotency-Key and retried on 503 as a real caller would.
	const clients, each = 6, 10
	var mu sync.Mutex
	var accepted []ledger.Accepted
	post := func(client string, n int) error {
		ingest := c.url("INGEST_PORT", "/v1/requests")
		if n%2 == 1 {
			ingest = c.url("INGEST2_PORT", "/v1/requests")
		}
		body, _ := json.Marshal(map[string]any{"clientId": client, "n": n})
		deadline := time.Now().Add(time.Minute)
		for {
			req, _ := http.NewRequest(http.MethodPost, ingest, bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%d", client, n))
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				var a struct{ ID, ClientID string }
				_ = json.NewDecoder(resp.Body).Decode(&a)
				resp.Body.Close()
				if resp.StatusCode == http.StatusAccepted {
					mu.Lock()
					accepted = append(accepted, ledger.Accepted{ClientID: a.ClientID, ID: a.ID})
					mu.Unlock()
					return nil
				}
				if resp.StatusCode != http.StatusServiceUnavailable {
					return fmt.Errorf("post %s/%d: %d", client, n, resp.StatusCode)
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("post %s/%d: no 202 within a minute (last error %v)", client, n, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	errs := make(chan error, clients)
	for i := range clients {
		go func() {
			for n := range each {
				if err := post(clientName(i), n); err != nil {
					errs <- err
					return
				}
				time.Sleep(800 * time.Millisecond)
			}
			errs <- nil
		}()
	}

	time.Sleep(3 * time.Second)
	c.must(time.Minute, "kill", "dispatcher-1")
	time.Sleep(time.Second)
	c.must(time.Minute, "kill", "nats-2")
	// From the host, dispatchctl goes on with a node down: it has all three.
	waitFor(t, 90*time.Second, "dispatchctl status to show the two servers left", func() bool {
		cmd := exec.Command(ctlBin, "status", "-json")
		cmd.Env = c.ctlEnv("e2e-o")
		out, err := cmd.Output()
		var st admin.Status
		return err == nil && json.Unmarshal(out, &st) == nil && len(st.NATS.Servers) == 2
	})
	// The kill must matter: dispatcher-2 takes every partition over.
	waitFor(t, 60*time.Second, "dispatcher-2 to own all 16 partitions", func() bool {
		return scrapeQuiet(c.url("DISPATCHER2_OPS_PORT", "/metrics"))["dispatch_partitions_owned"] == 16
	})
	c.must(2*time.Minute, "start", "nats-2", "dispatcher-1")
	waitReady(t, c.url("DISPATCHER_OPS_PORT", ""))
	waitFor(t, 60*time.Second, "nats-2 to be healthy again", func() bool { return c.healthy("nats-2") })
	for range clients {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}

	var arrivals []ledger.Arrival
	delivered := func() bool {
		resp, err := http.Get(c.url("RAVEN_PORT", "/arrivals"))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		arrivals = nil
		if json.NewDecoder(resp.Body).Decode(&arrivals) != nil {
			return false
		}
		got := map[string]bool{}
		for _, a := range arrivals {
			if a.Status < 300 {
				got[a.ID] = true
			}
		}
		for _, a := range accepted {
			if !got[a.ID] {
				return false
			}
		}
		return true
	}
	waitFor(t, 3*time.Minute, "every accepted request at the demo raven", delivered)
	rep := ledger.Check(arrivals, ledger.Expect{Interval: interval, Accepted: accepted, AllowUnacknowledged: true})
	t.Logf("compose run: %d accepted; %s", len(accepted), rep)
	for _, v := range rep.Violations {
		t.Errorf("guarantee broken: %s", v)
	}
	if rep.Delivered < clients*each {
		t.Fatalf("delivered %d distinct requests, want %d", rep.Delivered, clients*each)
	}
	c.rehearseADeadLetter(t, token)
}

// ctl runs dispatchctl from the host as the README's compose section says: all three
// NATS nodes, the ops user; the test fails unless it exits with want.
func (c *composeStack) ctl(want int, password string, args ...string) string {
	c.t.Helper()
	cmd := exec.Command(ctlBin, args...)
	cmd.Env = c.ctlEnv(password)
	out, err := cmd.CombinedOutput()
	if _, isExit := err.(*exec.ExitError); err != nil && !isExit {
		c.t.Fatalf("dispatchctl %q: %v", args, err)
	}
	if code := cmd.ProcessState.ExitCode(); code != want {
		c.t.Fatalf("dispatchctl %q: exit %d, want %d\n%s", args, code, want, out)
	}
	return string(out)
}

// ctlEnv is the host's environment for dispatchctl, as .env.example sets it.
func (c *composeStack) ctlEnv(password string) []string {
	return []string{"PATH=" + os.Getenv("PATH"), "NATS_USER=ops", "NATS_PASSWORD=" + password,
		"NATS_URL=nats://127.0.0.1:" + c.ports["NATS_PORT"] + ",nats://127.0.0.1:" + c.ports["NATS2_PORT"] + ",nats://127.0.0.1:" + c.ports["NATS3_PORT"]}
}

func (c *composeStack) ctlJSON(v any, args ...string) {
	c.t.Helper()
	out := c.ctl(0, "e2e-o", append([]string{args[0], "-json"}, args[1:]...)...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		c.t.Fatalf("dispatchctl %q -json printed what is not JSON (%v):\n%s", args, err, out)
	}
}

// operatorsFirstLook is what a new operator does first: dispatchctl status from the
// host (the meta group and both dispatchers visible), a wrong password told as such,
// ingest's metrics on the host, and no warning from a start on default settings.
func (c *composeStack) operatorsFirstLook(t *testing.T) {
	var st admin.Status
	waitFor(t, 60*time.Second, "status to show both dispatchers holding every partition", func() bool {
		c.ctlJSON(&st, "status")
		return st.Leases != nil && len(st.Leases.Instances) == 2 && len(st.Leases.Unowned) == 0
	})
	if st.NATS.Meta == nil || st.NATS.Meta.Leader == "" || len(st.NATS.Meta.Replicas) != 2 || len(st.NATS.Servers) != 3 {
		t.Errorf("status: meta %+v (%s), servers %v; want the meta leader and two followers of three servers", st.NATS.Meta, st.NATS.MetaNote, st.NATS.Servers)
	}
	mustContain(t, c.ctl(1, "wrong-password", "clients"), `refused user "ops"`)
	if m := scrapeQuiet(c.url("INGEST_OPS_PORT", "/metrics")); len(m) == 0 {
		t.Error("ingest-1's /metrics is not reachable from the host")
	}
	out, _ := c.run(time.Minute, "logs", "--no-color", "ingest-1", "ingest-2", "dispatcher-1", "dispatcher-2")
	for _, line := range strings.Split(out, "\n") {
		switch {
		case !strings.Contains(line, `"level":"warn"`), strings.Contains(line, "accepts requests from anyone"):
		case slices.ContainsFunc(busyWarnings, func(w string) bool { return strings.Contains(line, w) }):
			t.Logf("a warning of a cluster still forming or a busy machine, not of a setting: %s", line)
		default:
			t.Errorf("a default start warned: %s", line)
		}
	}
}

// busyWarnings are the warnings a start on default settings may give on a loaded machine
// (CI runs this test beside the others): NATS slow to answer while its cluster forms, or a
// renewal late. A warning about a setting is none of these.
var busyWarnings = []string{
	"not reachable yet; retrying", "acquiring lease failed", "heartbeat failed", "renewing leases failed",
	"listing backlog failed", "listing instances failed", "the lease watch ended", "cannot watch the leases",
	"nats disconnected", "writing request events failed", `"message":"not ready"`,
}

// rehearseADeadLetter follows the README: the demo raven refuses bob, bob's request is
// dead-lettered, its body is shown, raven accepts bob again, and a replay delivers it.
func (c *composeStack) rehearseADeadLetter(t *testing.T, token string) {
	call := func(method, url, body string, header map[string]string) (int, string) {
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := call(http.MethodPut, c.url("RAVEN_PORT", "/fail/bob"), "400", nil); code != 200 {
		t.Fatalf("PUT /fail/bob: %d %s", code, body)
	}
	code, body := call(http.MethodPost, c.url("INGEST_PORT", "/v1/requests"), `{"clientId":"bob","n":1}`,
		map[string]string{"Content-Type": "application/json", "Authorization": "Bearer " + token})
	var a struct{ ID string }
	if json.Unmarshal([]byte(body), &a); code != http.StatusAccepted || a.ID == "" {
		t.Fatalf("posting for bob: %d %s", code, body)
	}
	waitFor(t, 60*time.Second, "bob's request to be dead-lettered", func() bool {
		cmd := exec.Command(ctlBin, "deadletters", "-client", "bob")
		cmd.Env = c.ctlEnv("e2e-o")
		out, _ := cmd.CombinedOutput()
		return strings.Contains(string(out), a.ID)
	})
	// While a restarted node catches up a read may stall and fail; the operator, and the
	// test, run it again.
	waitFor(t, 60*time.Second, "deadletters -body to show bob's body", func() bool {
		cmd := exec.Command(ctlBin, "deadletters", "-id", a.ID, "-body")
		cmd.Env = c.ctlEnv("e2e-o")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Logf("deadletters -body: %v\n%s", err, out)
		}
		return err == nil && strings.Contains(string(out), `{"clientId":"bob","n":1}`)
	})
	if code, body := call(http.MethodDelete, c.url("RAVEN_PORT", "/fail/bob"), "", nil); code != 200 {
		t.Fatalf("DELETE /fail/bob: %d %s", code, body)
	}
	waitFor(t, 60*time.Second, "replay -client bob to requeue bob's request", func() bool {
		cmd := exec.Command(ctlBin, "replay", "-client", "bob")
		cmd.Env = c.ctlEnv("e2e-o")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Logf("replay: %v\n%s", err, out)
		}
		// A run that failed midway may have requeued it already: running it again is
		// safe, and the delivery below is what counts.
		return err == nil && (strings.Contains(string(out), "1 matched, 1 requeued") || strings.Contains(string(out), "0 matched"))
	})
	waitFor(t, 30*time.Second, "bob's replayed request at the demo raven", func() bool {
		_, body := call(http.MethodGet, c.url("RAVEN_PORT", "/arrivals"), "", nil)
		var as []ledger.Arrival
		_ = json.Unmarshal([]byte(body), &as)
		for _, x := range as {
			if x.ID == a.ID && x.Status == 200 {
				return true
			}
		}
		return false
	})
}
