package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/ledger"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/schedule"
	"github.com/penguinhq/dispatcher/pkg/tracing"
)

// spansNamed is the ended spans of that name, in the order they ended.
func spansNamed(sr *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

// One request that raven refuses twice (503) and then accepts is one trace: ingest's
// accept span, continuing penguin's traceparent, and three attempt spans, its children,
// the retries also linked to it, each with its outcome and raven's status; raven receives
// each attempt's traceparent, and the dispatcher's log line of each failed attempt
// carries the trace id raven received. A request raven refuses for good is dead-lettered
// (an event of its last attempt span); replayed, it gets a replay span in a trace of its
// own that links to the original, and its next attempt is the replay's child.
func TestOneRequestIsOneTrace(t *testing.T) {
	t.Parallel()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	var retried atomic.Int32
	var doomedFixed atomic.Bool
	s := newStack(t, options{interval: 100 * time.Millisecond, tracing: tp, policy: schedule.Policy{MaxAttempts: 5},
		respond: func(a ledger.Arrival) ledger.Response {
			switch {
			case a.ClientID == "traced" && retried.Add(1) <= 2:
				return ledger.Response{Status: http.StatusServiceUnavailable}
			case a.ClientID == "doomed" && !doomedFixed.Load():
				return ledger.Response{Status: http.StatusUnprocessableEntity}
			}
			return ledger.Response{}
		}})

	// Penguin's own trace context: ingest continues it.
	const callerTrace, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	h := jsonHeader()
	h.Set("traceparent", "00-"+callerTrace+"-"+callerSpan+"-01")
	a := s.postRaw(h, []byte(`{"clientId":"traced","n":1}`))
	if a.Status != http.StatusAccepted {
		t.Fatalf("post: %d %v", a.Status, a.Body)
	}
	id := a.str("id")
	waitFor(t, time.Minute, "the traced request to be delivered", func() bool { return s.ledger.Delivered() >= 1 })
	waitFor(t, time.Minute, "its three attempt spans to end", func() bool { return len(spansNamed(sr, "dispatch.attempt")) >= 3 })

	accepts := spansNamed(sr, "dispatch.accept")
	if len(accepts) != 1 {
		t.Fatalf("%d accept spans, want 1", len(accepts))
	}
	acc := accepts[0]
	if acc.SpanContext().TraceID().String() != callerTrace || acc.Parent().SpanID().String() != callerSpan || attr(acc, "dispatch.request_id") != id {
		t.Fatalf("the accept span: trace %s, parent %s, request %s; want penguin's trace %s and span %s, request %s",
			acc.SpanContext().TraceID(), acc.Parent().SpanID(), attr(acc, "dispatch.request_id"), callerTrace, callerSpan, id)
	}
	attempts := spansNamed(sr, "dispatch.attempt")
	wantOutcomes := []schedule.Outcome{schedule.OutcomeTransient, schedule.OutcomeTransient, schedule.OutcomeDelivered}
	wantStatus := []string{"503", "503", "200"}
	arrivals := arrivalsOf(s.ledger, "traced")
	if len(attempts) != 3 || len(arrivals) != 3 {
		t.Fatalf("%d attempt spans and %d arrivals at raven, want 3 of each", len(attempts), len(arrivals))
	}
	for i, sp := range attempts {
		if sp.SpanContext().TraceID() != acc.SpanContext().TraceID() || sp.Parent().SpanID() != acc.SpanContext().SpanID() {
			t.Errorf("attempt %d: trace %s, parent %s; want the accept span's trace and the accept span as parent", i+1, sp.SpanContext().TraceID(), sp.Parent().SpanID())
		}
		if got := attr(sp, "dispatch.attempt"); got != []string{"1", "2", "3"}[i] {
			t.Errorf("attempt span %d says attempt %s", i+1, got)
		}
		if attr(sp, "dispatch.outcome") != string(wantOutcomes[i]) || attr(sp, "http.response.status_code") != wantStatus[i] || attr(sp, "dispatch.request_id") != id {
			t.Errorf("attempt %d: outcome %q, status %q, request %q; want %s, %s, %s", i+1, attr(sp, "dispatch.outcome"),
				attr(sp, "http.response.status_code"), attr(sp, "dispatch.request_id"), wantOutcomes[i], wantStatus[i], id)
		}
		links := sp.Links()
		if i == 0 && len(links) != 0 {
			t.Errorf("the first attempt has %d links, want none (it is the accept span's child)", len(links))
		}
		if i > 0 && (len(links) != 1 || links[0].SpanContext.SpanID() != acc.SpanContext().SpanID()) {
			t.Errorf("retry %d: links %v, want one to the accept span", i+1, links)
		}
		if attr(sp, "dispatch.waited_seconds") == "" {
			t.Errorf("attempt %d does not say how long it waited in its lane", i+1)
		}
		// What raven received: this attempt's own context, in the request's trace.
		want := "00-" + callerTrace + "-" + sp.SpanContext().SpanID().String() + "-01"
		if got := arrivals[i].Header.Get("traceparent"); got != want {
			t.Errorf("raven received the traceparent %q on attempt %d, want %q", got, i+1, want)
		}
		for _, kv := range sp.Attributes() {
			if strings.Contains(kv.Value.String(), "traced") {
				t.Errorf("attempt span attribute %s carries the clientId", kv.Key)
			}
		}
	}
	// The log lines of the failed attempts carry the trace id raven received.
	logged := 0
	for _, line := range strings.Split(s.dispatchLog.String(), "\n") {
		var l map[string]any
		if json.Unmarshal([]byte(line), &l) != nil || l["request_id"] != id {
			continue
		}
		if l["trace_id"] != callerTrace {
			t.Errorf("a log line of the request carries trace_id %v, want %s: %s", l["trace_id"], callerTrace, line)
		}
		logged++
	}
	t.Logf("%d log lines of the request carry its trace id", logged)
	if logged < 2 {
		t.Errorf("%d log lines of the request's failed attempts, want 2 with its trace id:\n%s", logged, s.dispatchLog.String())
	}

	// Dead-lettered, then replayed: the replay links to the original trace.
	doomed := s.post("doomed", 0)
	waitFor(t, time.Minute, "the doomed request to be dead-lettered", func() bool { return s.dead()[doomed] })
	var last sdktrace.ReadOnlySpan
	waitFor(t, time.Minute, "the doomed request's attempt span to end", func() bool {
		for _, sp := range spansNamed(sr, "dispatch.attempt") {
			if attr(sp, "dispatch.request_id") == doomed {
				last = sp
			}
		}
		return last != nil
	})
	if ev := last.Events(); len(ev) != 1 || ev[0].Name != "dispatch.dead_lettered" || attr(last, "dispatch.outcome") != string(schedule.OutcomePermanent) {
		t.Fatalf("the doomed request's attempt span: outcome %s, events %v; want a permanent failure with one dead_lettered event", attr(last, "dispatch.outcome"), ev)
	}
	original := last.SpanContext().TraceID()
	ctl, err := s.q.Control(context.Background(), testLog())
	if err != nil {
		t.Fatal(err)
	}
	svc, err := admin.New(admin.Config{Queue: s.q, Control: ctl, Log: testLog(), Tracing: tp})
	if err != nil {
		t.Fatal(err)
	}
	doomedFixed.Store(true)
	s.markReplayed(doomed)
	if rep, err := svc.Replay(context.Background(), queue.DeadFilter{ID: doomed}, false, false, nil); err != nil || rep.Requeued != 1 {
		t.Fatalf("replay: %+v, %v", rep, err)
	}
	waitFor(t, time.Minute, "the replayed request to be delivered", func() bool {
		for _, sp := range spansNamed(sr, "dispatch.attempt") {
			if attr(sp, "dispatch.request_id") == doomed && attr(sp, "dispatch.outcome") == string(schedule.OutcomeDelivered) {
				return true
			}
		}
		return false
	})
	replays := spansNamed(sr, "dispatch.replay")
	if len(replays) != 1 {
		t.Fatalf("%d replay spans, want 1", len(replays))
	}
	rp := replays[0]
	if rp.SpanContext().TraceID() == original || len(rp.Links()) != 1 || rp.Links()[0].SpanContext.TraceID() != original {
		t.Fatalf("the replay span: trace %s, links %v; want a trace of its own linked to the original %s", rp.SpanContext().TraceID(), rp.Links(), original)
	}
	for _, sp := range spansNamed(sr, "dispatch.attempt") {
		if attr(sp, "dispatch.request_id") == doomed && attr(sp, "dispatch.cycle") == "1" && sp.Parent().SpanID() != rp.SpanContext().SpanID() {
			t.Errorf("an attempt after the replay has the parent %s, want the replay span %s", sp.Parent().SpanID(), rp.SpanContext().SpanID())
		}
	}
	got := arrivalsOf(s.ledger, "doomed")
	if tid := tracing.TraceID(got[len(got)-1].Header.Get("traceparent")); tid != rp.SpanContext().TraceID().String() {
		t.Errorf("raven received the replayed request in trace %q, want the replay's %s", tid, rp.SpanContext().TraceID())
	}
	s.finish(30*time.Second, 0)
}

// Without a tracer provider nothing is traced, and the caller's trace context passes
// through unchanged, as W3C Trace Context asks of an intermediary: raven receives
// penguin's traceparent and tracestate on every attempt (the first one refused here),
// and a batch's on each item; a request sent without one, or with one that is not
// valid, reaches raven without.
func TestCallersTraceContextPassesThroughWithTracingOff(t *testing.T) {
	t.Parallel()
	var firstRefused sync.Once
	s := newStack(t, options{interval: 50 * time.Millisecond, respond: func(a ledger.Arrival) ledger.Response {
		refuse := false
		if a.ClientID == "plain" {
			firstRefused.Do(func() { refuse = true })
		}
		if refuse {
			return ledger.Response{Status: 503}
		}
		return ledger.Response{}
	}})
	const parent, state = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
	h := jsonHeader()
	h.Set("traceparent", parent)
	h.Set("tracestate", state)
	if a := s.postRaw(h, []byte(`{"clientId":"plain","n":1}`)); a.Status != http.StatusAccepted {
		t.Fatalf("post: %d", a.Status)
	}
	if a := s.postRaw(jsonHeader(), []byte(`{"clientId":"bare","n":1}`)); a.Status != http.StatusAccepted {
		t.Fatalf("post: %d", a.Status)
	}
	bad := jsonHeader()
	bad.Set("traceparent", "00-not-a-trace-01")
	if a := s.postRaw(bad, []byte(`{"clientId":"bad","n":1}`)); a.Status != http.StatusAccepted {
		t.Fatalf("post: %d", a.Status)
	}
	bh := http.Header{"Content-Type": {"application/x-ndjson"}, "Traceparent": {parent}}
	code, _, body := postBatchWith(t, s.http, s.ingestBase(), bh, []byte("{\"clientId\":\"b1\",\"body\":{}}\n{\"clientId\":\"b2\",\"body\":{}}\n"))
	if code != http.StatusOK || body["accepted"] != float64(2) {
		t.Fatalf("batch: %d %v", code, body)
	}
	for _, r := range body["results"].([]any) {
		item := r.(map[string]any)
		s.accept(item["clientId"].(string), item["id"].(string))
	}
	waitFor(t, time.Minute, "the requests to be delivered", func() bool { return s.ledger.Delivered() == 5 })
	plain := arrivalsOf(s.ledger, "plain")
	if len(plain) != 2 {
		t.Fatalf("plain arrived %d times, want 2 (one refused)", len(plain))
	}
	for i, a := range plain {
		if a.Header.Get("traceparent") != parent || a.Header.Get("tracestate") != state {
			t.Errorf("attempt %d reached raven with traceparent %q tracestate %q, want the caller's unchanged", i+1, a.Header.Get("traceparent"), a.Header.Get("tracestate"))
		}
	}
	for _, c := range []string{"b1", "b2"} {
		if tp := arrivalsOf(s.ledger, c)[0].Header.Get("traceparent"); tp != parent {
			t.Errorf("batch item %s reached raven with traceparent %q, want the batch's", c, tp)
		}
	}
	for _, c := range []string{"bare", "bad"} {
		if tp := arrivalsOf(s.ledger, c)[0].Header.Get("traceparent"); tp != "" {
			t.Errorf("%s reached raven with traceparent %q, want none", c, tp)
		}
	}
	s.finish(10*time.Second, 0)
}
