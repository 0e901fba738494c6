package integration

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/penguinhq/dispatcher/integration/itest"
	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/ledger"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// followEvents follows the events stream from its start with an ordered consumer, as
// penguin would with any NATS client, and returns each request's events in the order
// stored.
func (s *stack) followEvents(t *testing.T) func() map[string][]request.Event {
	t.Helper()
	js, err := jetstream.New(s.nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stream, err := js.Stream(ctx, queue.EventStream)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{request.EventPrefix + ">"}})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := map[string][]request.Event{}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		var e request.Event
		if err := json.Unmarshal(m.Data(), &e); err != nil {
			t.Errorf("event on %s is not JSON: %v", m.Subject(), err)
			return
		}
		if want := e.Subject(); m.Subject() != want {
			t.Errorf("event on %s, want it on %s", m.Subject(), want)
		}
		mu.Lock()
		got[e.ID] = append(got[e.ID], e)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	return func() map[string][]request.Event {
		mu.Lock()
		defer mu.Unlock()
		out := map[string][]request.Event{}
		for id, es := range got {
			out[id] = slices.Clone(es)
		}
		return out
	}
}

// kinds names events as "type/cycle/attempt".
func kinds(es []request.Event) []string {
	var out []string
	for _, e := range es {
		out = append(out, fmt.Sprintf("%s/%d/%d", e.Type, e.Cycle, e.Attempt))
	}
	return out
}

// startedAsWanted drops from got the attempt_started events that want does not name: an
// attempt that was not meant to be slow may still have taken longer than
// dispatch.StartedEventAfter on a loaded machine.
func startedAsWanted(got, want []string) []string {
	var out []string
	for _, k := range got {
		if strings.HasPrefix(k, string(request.EventAttemptStarted)+"/") && !slices.Contains(want, k) {
			continue
		}
		out = append(out, k)
	}
	return out
}

// A subscriber to the events stream sees every outcome of a run with retries, a dead
// letter, a replay and a purge, in order for each request, from its first attempt: the
// accepted event is not stored (ADR 18). A live subscriber of the clients' subjects
// hears it.
func TestEventsFollowEachRequest(t *testing.T) {
	t.Parallel()
	var idaFails atomic.Bool
	idaFails.Store(true)
	// hal's first two attempts are slow: raven holds each until its attempt_started event
	// is in the stream (written once an attempt has run dispatch.StartedEventAfter), so
	// that it is there however late the machine runs its timers.
	var events func() map[string][]request.Event
	following := make(chan struct{})
	startedSeen := func(a ledger.Arrival) bool {
		<-following
		ok, _ := itest.Poll(time.Minute, func() (bool, string) {
			return slices.Contains(kinds(events()[a.ID]), fmt.Sprintf("%s/0/%d", request.EventAttemptStarted, a.Attempt)), ""
		})
		return ok
	}
	s := newStack(t, options{interval: 100 * time.Millisecond, timeout: 5 * time.Minute, respond: func(a ledger.Arrival) ledger.Response {
		switch {
		case a.ClientID == "hal" && a.Attempt < 3:
			if !startedSeen(a) {
				t.Errorf("hal's attempt %d: no attempt_started event within a minute", a.Attempt)
			}
			return ledger.Response{Status: 503}
		case a.ClientID == "ida" && idaFails.Load():
			return ledger.Response{Status: 400}
		}
		return ledger.Response{}
	}})
	events = s.followEvents(t)
	close(following)
	live := make(chan string, 16) // ids of the accepted events heard live
	sub, err := s.nc.Subscribe(request.EventPrefix+"*."+string(request.EventAccepted), func(m *nats.Msg) {
		live <- m.Header.Get(request.EventIDHeader)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := s.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctl, err := s.q.Control(context.Background(), testLog())
	if err != nil {
		t.Fatal(err)
	}
	svc, err := admin.New(admin.Config{Queue: s.q, Control: ctl, Log: testLog(), Instance: "ops"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := svc.Pause(ctx, "jo", "test"); err != nil {
		t.Fatal(err)
	}
	// The pause reaches the dispatcher through its watch of the control bucket: jo posts
	// once it has, or a loaded machine may send his request before it (delivered, not
	// purged).
	waitFor(t, time.Minute, "the dispatcher to apply jo's pause", func() bool {
		return len(logLines(s.dispatchLog.String(), "client steering changed")) >= 1
	})
	hal, ida, jo := s.post("hal", 1), s.post("ida", 1), s.post("jo", 1)

	waitFor(t, time.Minute, "ida's dead letter", func() bool { return s.dead()[ida] })
	idaFails.Store(false)
	if rep, err := svc.Replay(ctx, queue.DeadFilter{ID: ida}, false, false, nil); err != nil || rep.Requeued != 1 {
		t.Fatalf("replay: %+v %v", rep, err)
	}
	s.markReplayed(ida)
	if _, err := svc.Purge(ctx, "jo", "jo", "test", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		// An attempt that ends within StartedEventAfter has no attempt_started: its
		// outcome says it all. One that took longer on a loaded machine has one, which
		// the comparison below allows.
		hal: {"attempt_started/0/1", "attempt_failed/0/1", "attempt_started/0/2", "attempt_failed/0/2", "delivered/0/3"},
		ida: {"dead_lettered/0/1", "replayed/1/0", "delivered/1/1"},
		jo:  {"purged/0/0"},
	}
	var got map[string][]request.Event
	waitForState(t, time.Minute, "every event", func() (bool, string) {
		got = events()
		// As producers.md says to read them: replayed (the replaying process's) may land
		// after the dispatcher's first event of its cycle.
		for _, es := range got {
			slices.SortStableFunc(es, func(a, b request.Event) int {
				return cmp.Or(cmp.Compare(a.Cycle, b.Cycle), cmp.Compare(a.Attempt, b.Attempt))
			})
		}
		for id, w := range want {
			if len(startedAsWanted(kinds(got[id]), w)) < len(w) {
				return false, fmt.Sprintf("%s: %v", id, kinds(got[id]))
			}
		}
		return true, ""
	})
	for id, w := range want {
		if k := startedAsWanted(kinds(got[id]), w); !slices.Equal(k, w) {
			t.Fatalf("events of %s: %v, want %v", id, kinds(got[id]), w)
		}
		// The events as wanted, by position: without an attempt_started that a loaded
		// machine added (seen: ida's first attempt, where its dead letter was expected).
		got[id] = slices.DeleteFunc(got[id], func(e request.Event) bool {
			k := fmt.Sprintf("%s/%d/%d", e.Type, e.Cycle, e.Attempt)
			return e.Type == request.EventAttemptStarted && !slices.Contains(w, k)
		})
	}
	if e := got[hal][1]; e.Status != 503 || e.ClientID != "hal" || e.Instance != "test" {
		t.Errorf("hal's failed attempt: %+v, want raven's 503 from instance test", e)
	}
	if e := got[ida][0]; e.Reason != request.ReasonPermanent || e.Status != 400 {
		t.Errorf("ida's dead letter: %+v, want permanent after a 400", e)
	}
	if e := got[ida][1]; e.Instance != "ops" || e.Seq == 0 {
		t.Errorf("ida's replay: %+v, want written by the replaying process with ida's new sequence", e)
	}
	if e := got[jo][0]; e.Reason != request.ReasonPurged {
		t.Errorf("jo's purge: %+v, want reason purged", e)
	}
	// Each acceptance was heard live, once per request.
	heard := map[string]bool{}
	for len(heard) < 3 {
		select {
		case id := <-live:
			heard[id] = true
		case <-time.After(time.Minute):
			t.Fatalf("accepted events heard live: %v, want hal's, ida's and jo's", heard)
		}
	}
	if !heard[hal] || !heard[ida] || !heard[jo] {
		t.Errorf("accepted events heard live: %v, want hal's %s, ida's %s and jo's %s", heard, hal, ida, jo)
	}
	// And the status record says the same.
	clientOf := map[string]string{hal: "hal", ida: "ida", jo: "jo"}
	for id, state := range map[string]request.State{hal: request.StateDelivered, ida: request.StateDelivered, jo: request.StateDeadLettered} {
		st, err := s.q.Status(ctx, clientOf[id], id)
		if err != nil || st.State != state {
			t.Errorf("status of %s: %+v %v, want %s", id, st, err, state)
		}
	}
	if st, _ := s.q.Status(ctx, "ida", ida); st.Replays != 1 {
		t.Errorf("ida's status: %+v, want 1 replay", st)
	}
	s.finish(20*time.Second, 0)
}

// Not-Before: a request is not attempted before its time, holds its client's later
// requests behind it (order and spacing kept), and too far ahead is refused.
func TestNotBefore(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{interval: 200 * time.Millisecond})
	hc := apiClient(t)
	post := func(client, notBefore string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, s.ingestURL, strings.NewReader(`{"x":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Client-Id", client)
		if notBefore != "" {
			req.Header.Set("Not-Before", notBefore)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var out map[string]any
		_ = json.Unmarshal(raw, &out)
		if resp.StatusCode == http.StatusAccepted {
			s.accept(client, out["id"].(string))
		}
		return resp.StatusCode, out
	}
	sent := time.Now()
	code, kai1 := post("kai", "2")
	if code != 202 || kai1["notBefore"] == nil {
		t.Fatalf("kai with Not-Before 2: %d %v, want 202 with its notBefore", code, kai1)
	}
	code, kai2 := post("kai", "")
	at := time.Now().Add(1500 * time.Millisecond).UTC().Format(time.RFC3339Nano)
	code2, lou := post("lou", at)
	if code != 202 || code2 != 202 {
		t.Fatalf("kai's second, lou's: %d, %d", code, code2)
	}
	for _, tc := range []struct{ v, why string }{
		{strconv.Itoa(8 * 24 * 3600), "MAX_NOT_BEFORE"},
		{time.Now().Add(8 * 24 * time.Hour).Format(time.RFC3339), "MAX_NOT_BEFORE"},
		{"soon", "RFC 3339"},
		{"99999999999999999999999", "MAX_NOT_BEFORE"},
	} {
		if code, p := post("kai", tc.v); code != 400 || p["code"] != "not_before_invalid" || !strings.Contains(fmt.Sprint(p["detail"]), tc.why) {
			t.Errorf("Not-Before %q: %d %v, want 400 not_before_invalid saying %s", tc.v, code, p, tc.why)
		}
	}
	// Not attempted yet, it has no stored event (ADR 18): its status, as penguin reads it,
	// comes from the queue, with its Not-Before.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if st, err := goClient(t, s.ingestBase()).Status(ctx, "kai", kai1["id"].(string)); err != nil || st.NotBefore.IsZero() {
		t.Errorf("kai's status: %+v %v, want its not-before", st, err)
	}
	s.finish(20*time.Second, 0)
	first := map[string]time.Time{}
	for _, a := range s.ledger.Arrivals() {
		if _, ok := first[a.ID]; !ok {
			first[a.ID] = a.Start
		}
	}
	// Against the Not-Before ingest answered, on the wall clock both are read from (the
	// time since the test sent it, on the monotonic clock, can differ from it by a few
	// milliseconds when the machine's wall clock is adjusted meanwhile).
	kaiNB, err := time.Parse(time.RFC3339Nano, fmt.Sprint(kai1["notBefore"]))
	if err != nil || kaiNB.Sub(sent) < 2*time.Second-50*time.Millisecond {
		t.Errorf("kai's notBefore %v (%v) is not 2 s after it was sent", kai1["notBefore"], err)
	}
	if f := first[kai1["id"].(string)]; f.Round(0).Before(kaiNB) {
		t.Errorf("kai's first went at %s, before its Not-Before %s", f.UTC(), kaiNB)
	}
	if !first[kai2["id"].(string)].After(first[kai1["id"].(string)]) {
		t.Errorf("kai's second request went before the first, which was held by its Not-Before")
	}
	nb, _ := time.Parse(time.RFC3339Nano, at)
	if first[lou["id"].(string)].Before(nb) {
		t.Errorf("lou's went at %s, before its Not-Before %s", first[lou["id"].(string)], nb)
	}
}

// A request's MAX_AGE counts from its first attempt, so not before its Not-Before:
// one delayed beyond MAX_AGE that fails once when it falls due is retried and delivered,
// not dead-lettered as too old.
func TestNotBeforeBeyondMaxAge(t *testing.T) {
	t.Parallel()
	// In seconds, so that the retry after the first failure lands well within MAX_AGE of
	// the Not-Before on a loaded machine.
	s := newStack(t, options{interval: 100 * time.Millisecond, policy: schedule.Policy{MaxAge: 3 * time.Second},
		respond: func(a ledger.Arrival) ledger.Response {
			if a.Attempt == 1 {
				return ledger.Response{Status: http.StatusInternalServerError}
			}
			return ledger.Response{}
		}})
	h := jsonHeader()
	h.Set("Not-Before", "6") // due 6 s after its acceptance: twice MAX_AGE
	a := s.postRaw(h, []byte(`{"clientId":"nia"}`))
	if a.Status != http.StatusAccepted {
		t.Fatalf("post with Not-Before 6: %d %v", a.Status, a.Body)
	}
	id := a.str("id")
	s.finish(time.Minute, 0)
	if dead := s.deadLetters(); len(dead) != 0 {
		t.Fatalf("dead-lettered: %+v; want it retried after its first failure, its age counted from its Not-Before", dead[0].Verdict)
	}
	var attempts []int
	for _, ar := range s.ledger.Arrivals() {
		if ar.ID == id {
			attempts = append(attempts, ar.Attempt)
		}
	}
	if !slices.Equal(attempts, []int{1, 2}) {
		t.Fatalf("attempts %v, want [1 2]: a transient failure, then the delivery", attempts)
	}
}
