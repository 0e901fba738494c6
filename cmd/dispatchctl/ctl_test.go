package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/governor"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// standalone is a queue on an embedded JetStream server with no dispatcher running, as
// a standalone's NATS is seen from outside: no lease bucket.
type standalone struct {
	q   *queue.Queue
	url string
}

func newStandalone(t *testing.T) *standalone {
	t.Helper()
	s := queuetest.Server(t)
	nc, err := queue.Connect(s.ClientURL(), "dispatchctl-test", zerolog.Nop(), queue.Security{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	q, err := nc.Open(context.Background(), queue.Config{Partitions: 4}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	return &standalone{q: q, url: s.ClientURL()}
}

// ctl runs dispatchctl with args and no environment, and returns its exit code, stdout
// and stderr.
func (s *standalone) ctl(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, func(string) string { return "" }, strings.NewReader(""), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func (s *standalone) publish(t *testing.T, client, id string) {
	t.Helper()
	if _, err := s.q.Publish(context.Background(), request.Request{ID: id, ClientID: client, ContentType: "application/json", Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
}

// bury moves client's head request to the dead-letter stream after attempts, as a
// dispatcher would.
func (s *standalone) bury(t *testing.T, client string, attempts int) {
	t.Helper()
	ctx := context.Background()
	lane, _, ok, err := s.q.ClientLane(ctx, client)
	if err != nil || !ok {
		t.Fatalf("client %s: %v %v", client, ok, err)
	}
	st, _, err := s.q.Head(ctx, lane)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.q.AddDeadLetter(ctx, st, request.Verdict{Reason: request.ReasonPermanent, LastStatus: 400, Attempts: attempts}); err != nil {
		t.Fatal(err)
	}
	if err := s.q.Delete(ctx, st.Lane, st.Seq); err != nil {
		t.Fatal(err)
	}
}

// The flags every command takes may come before its name as well as after it.
func TestGlobalFlagsBeforeTheCommand(t *testing.T) {
	s := newStandalone(t)
	for _, args := range [][]string{
		{"-nats-url", s.url, "-timeout=30s", "-json", "status"},
		{"--nats-url=" + s.url, "status", "-json"},
		{"status", "-nats-url", s.url, "-json"},
	} {
		code, out, errs := s.ctl(t, args...)
		var st struct{ Queue json.RawMessage }
		if code != exitOK || json.Unmarshal([]byte(out), &st) != nil || st.Queue == nil {
			t.Errorf("dispatchctl %q: exit %d, want 0 and the status as JSON\nstdout: %s\nstderr: %s", args, code, out, errs)
		}
	}
	code, _, errs := s.ctl(t, "-nats-url", s.url, "-sort", "age", "clients")
	if code != exitUsage || !strings.Contains(errs, "-sort before the command is not a flag every command takes") {
		t.Errorf("a command's own flag before its name: exit %d, %s; want 2 saying to give it after the name", code, errs)
	}
	if code, _, errs := s.ctl(t, "-json", "-nats-url"); code != exitUsage || !strings.Contains(errs, "-nats-url needs a value") {
		t.Errorf("a flag without its value before the command: exit %d, %s; want 2 saying it needs one", code, errs)
	}
	// A bound that ends the command before it starts is the command line's fault (it was
	// a NATS error, exit 1: "stream REQUESTS: context deadline exceeded").
	for _, d := range []string{"0", "-1s"} {
		if code, _, errs := s.ctl(t, "-nats-url", s.url, "-timeout", d, "steering"); code != exitUsage || !strings.Contains(errs, "-timeout "+strings.TrimSuffix(d, "s")) {
			t.Errorf("-timeout %s: exit %d, %s; want 2 saying to give a positive duration", d, code, errs)
		}
	}
	if code, out, _ := s.ctl(t, "-nats-url", s.url, "-h"); code != exitOK || !strings.Contains(out, "Usage: dispatchctl") {
		t.Errorf("-h after a flag: exit %d, %s; want the usage", code, out)
	}
}

// On a standalone (no lease bucket), status says how to tell whether the dispatcher
// runs, and gives no advice about a cluster's nats.conf.
func TestStatusOnAStandaloneSaysWhereToLook(t *testing.T) {
	s := newStandalone(t)
	code, out, errs := s.ctl(t, "status", "-nats-url", s.url)
	if code != exitOK {
		t.Fatalf("status: exit %d\n%s\n%s", code, out, errs)
	}
	for _, want := range []string{"A standalone dispatcher owns every partition without them", "/readyz", "console"} {
		if !strings.Contains(out, want) {
			t.Errorf("status on a standalone does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "nats.conf") {
		t.Errorf("status on a standalone points to nats.conf:\n%s", out)
	}
}

// clients says how many clients have a backlog, and which page of how many it shows;
// with none, it says so.
func TestClientsSaysHowManyAndWhichPage(t *testing.T) {
	s := newStandalone(t)
	if _, out, _ := s.ctl(t, "clients", "-nats-url", s.url); strings.TrimSpace(out) != "no client has a backlog" {
		t.Errorf("clients with none: %q, want \"no client has a backlog\"", out)
	}
	s.publish(t, "alice", "a1")
	if _, out, _ := s.ctl(t, "clients", "-nats-url", s.url); !strings.Contains(out, "\n1 client with a backlog (page 1 of 1, 50 per page, by backlog)\n") {
		t.Errorf("clients with one:\n%s", out)
	}
	s.publish(t, "bob", "b1")
	if _, out, _ := s.ctl(t, "clients", "-nats-url", s.url); !strings.Contains(out, "\n2 clients with a backlog (page 1 of 1, 50 per page, by backlog)\n") {
		t.Errorf("clients with two:\n%s", out)
	}
}

// clients names a dispatcher that could not answer, under the table its lanes are
// missing from.
func TestClientsNamesADispatcherThatCannotAnswer(t *testing.T) {
	s := newStandalone(t)
	s.publish(t, "alice", "a1")
	stop, err := s.q.ServeQuestions("d1", func(context.Context, string, []byte) ([]byte, error) {
		return nil, errors.New("busy")
	}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	// The lane wait is long enough for the word on a busy machine, and asked again while
	// it was not (a stall of this process longer than the wait): the verdict is what the
	// word says, not how soon it came.
	const word = "\ncould not read dispatcher d1's answer: busy: its clients' lanes are missing above\n"
	var out string
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, out, _ = s.ctl(t, "clients", "-nats-url", s.url, "-lane-wait", "2s"); strings.Contains(out, word) || time.Now().After(deadline) {
			break
		}
	}
	if !strings.Contains(out, word) {
		t.Errorf("clients beside a dispatcher that cannot answer:\n%s", out)
	}
}

// replay prints a table like deadletters: a header, a row per dead letter, no trailing
// tab; and one attempt is "1 attempt".
func TestReplayPrintsATable(t *testing.T) {
	s := newStandalone(t)
	s.publish(t, "alice", "a1")
	s.bury(t, "alice", 1)
	code, out, errs := s.ctl(t, "replay", "-nats-url", s.url, "-all", "-dry-run")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != exitOK || len(lines) != 3 || !strings.HasPrefix(lines[0], "OUTCOME ") || !strings.HasPrefix(lines[1], "would_requeue ") ||
		!strings.Contains(lines[1], " a1 ") || lines[2] != "1 matched, 1 would be requeued, 0 skipped" {
		t.Errorf("replay -dry-run: exit %d, want a header, a row for a1 and the count:\n%s\n%s", code, out, errs)
	}
	if strings.Contains(out, "\t") {
		t.Errorf("replay -dry-run printed tabs, not a table:\n%q", out)
	}
	if _, out, _ := s.ctl(t, "deadletters", "-nats-url", s.url, "-body"); !strings.Contains(out, ", 1 attempt, ") {
		t.Errorf("a dead letter after one attempt does not say \"1 attempt\":\n%s", out)
	}
}

// Times to come read as a person reads them, not to the millisecond. In a bubble, whose
// clock does not move between the test's time.Now and relative's: on the real clock, 90
// ms between the two on a loaded machine made 3.24 s read "in 3.1s".
func TestRelativeTimesAreRounded(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		if got := relative(time.Now().Add(59294 * time.Millisecond)); got != "in 59s" {
			t.Errorf("59.294 s from now: %q, want \"in 59s\"", got)
		}
		if got := relative(time.Now().Add(3240 * time.Millisecond)); got != "in 3.2s" {
			t.Errorf("3.24 s from now: %q, want \"in 3.2s\"", got)
		}
	})
}

// A budget of 0 is no limit, and says so: not "none", not 0.
func TestBudgetSaysNoLimit(t *testing.T) {
	t.Parallel()
	zero := 0.0
	view := admin.BudgetView{Steered: &request.Budget{MaxRate: &zero, By: "ops"},
		Instances: []admin.InstanceBudget{{Instance: "d1", BudgetState: governor.BudgetState{Owned: 4, Partitions: 4, Why: "start"}}}}
	var out bytes.Buffer
	printBudget(&out, view, time.Now())
	got := out.String()
	for _, want := range []string{"rate no limit, in flight configured", "shares no limit, effective no limit, 0 lanes waiting",
		"d1\tno limit\t4/4\tno limit\tno limit\t"} {
		if !strings.Contains(got, want) {
			t.Errorf("the budget does not say %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "none") {
		t.Errorf("the budget says none for no limit:\n%s", got)
	}
}

// The request's record says "1 attempt", "1 replay".
func TestRequestCountsInTheSingular(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	printRequest(&out, admin.RequestState{ID: "r1", State: request.StateDelivered, Record: &request.Status{State: request.StateDelivered, Attempts: 1, Replays: 1}})
	if !strings.Contains(out.String(), "delivered, 1 attempt, 1 replay, updated") {
		t.Errorf("a record of one attempt and one replay:\n%s", &out)
	}
}
