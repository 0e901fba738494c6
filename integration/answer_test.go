package integration

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/client"
	"github.com/penguinhq/dispatcher/pkg/ledger"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// Raven's answer is kept with the request's outcome and read later in its status, on a
// real ingest, dispatcher and raven with the binary's defaults (64 KiB of body, the
// Content-Type): a delivery's JSON as text, a refusal's reason with the dead letter, a
// binary answer as base64, and a failed attempt's answer cut to 4 KiB in the timeline.
func TestRavensAnswerReadLater(t *testing.T) {
	t.Parallel()
	binary := []byte{0x89, 'P', 'N', 'G', 0, 1, 2}
	busy := bytes.Repeat([]byte("b"), 10<<10)
	s := newStack(t, options{interval: 100 * time.Millisecond, respond: func(a ledger.Arrival) ledger.Response {
		switch a.ClientID {
		case "ana":
			return ledger.Response{Status: 201, ContentType: "application/json", Body: []byte(`{"order":"` + a.ID + `"}`)}
		case "bo":
			return ledger.Response{Status: 422, ContentType: "text/plain", Body: []byte("no such account")}
		case "cy":
			if a.Attempt == 1 {
				return ledger.Response{Status: 503, ContentType: "text/plain", Body: busy}
			}
			return ledger.Response{Status: 200, Body: binary}
		}
		return ledger.Response{Status: 200}
	}})
	c := goClient(t, s.ingestBase())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	final := func(clientID string) client.Status {
		t.Helper()
		r, err := c.Submit(ctx, clientID, []byte(`{"n":1}`))
		if err != nil {
			t.Fatal(err)
		}
		s.accept(clientID, r.ID)
		var st client.Status
		waitForState(t, time.Minute, clientID+"'s request final", func() (bool, string) {
			st, err = c.Status(ctx, r.ClientID, r.ID)
			return err == nil && st.Final(), fmt.Sprintf("%+v (%v)", st, err)
		})
		return st
	}

	ana := final("ana")
	if r := ana.Response; ana.State != client.StatusDelivered || r == nil || r.Status != 201 || r.Text != `{"order":"`+ana.ID+`"}` ||
		r.Headers["Content-Type"] != "application/json" || r.Encoding != "" || r.Truncated {
		t.Errorf("ana: %+v, response %+v: want delivered with raven's JSON", ana, r)
	}

	bo := final("bo")
	if r := bo.Response; bo.State != client.StatusDeadLettered || r == nil || r.Status != 422 || r.Text != "no such account" || r.Headers["Content-Type"] != "text/plain" {
		t.Errorf("bo: %+v, response %+v: want dead-lettered with raven's reason", bo, r)
	}

	cy := final("cy")
	got, err := cy.Response.Body()
	if cy.State != client.StatusDelivered || cy.Response.Encoding != "base64" || err != nil || !bytes.Equal(got, binary) {
		t.Errorf("cy: %+v, body %q (%v): want delivered with raven's bytes", cy, got, err)
	}
	events, err := s.q.Events(ctx, "cy", cy.ID)
	if err != nil {
		t.Fatal(err)
	}
	var failed *request.Response
	for _, e := range events {
		if e.Type == request.EventAttemptFailed {
			failed = e.Response
		}
	}
	if failed == nil || failed.Status != 503 || failed.BodyBytes != request.FailedAnswerBytes || !failed.Truncated || !strings.HasPrefix(string(busy), failed.Body) {
		t.Errorf("the failed attempt's answer in the timeline: %+v, want 503 and its first 4 KiB, truncated", failed)
	}
	s.finish(15*time.Second, 0)
}

// Prefer: wait=N (RFC 7240) on a POST holds the answer until the request is final, on a
// real ingest, dispatcher and raven: 200 with its status and raven's answer inline; the
// same key sent again waits for the same request; a wait that ends first is the 202 of
// always, saying it waited; a wait over MAX_STATUS_WAIT is cut to it; a malformed wait is
// a 400 that stores nothing.
func TestPreferWaitAnswersInline(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{interval: 100 * time.Millisecond, respond: func(a ledger.Arrival) ledger.Response {
		if a.ClientID == "slow" {
			return ledger.Response{Status: 200, Delay: 3 * time.Second, Body: []byte("late")}
		}
		return ledger.Response{Status: 201, ContentType: "application/json", Body: []byte(`{"echo":"` + a.ID + `"}`)}
	}})
	post := func(client, prefer, key string) answer {
		t.Helper()
		h := http.Header{"Content-Type": {"application/json"}, "X-Client-Id": {client}}
		if prefer != "" {
			h.Set("Prefer", prefer)
		}
		if key != "" {
			h.Set("Idempotency-Key", key)
		}
		return s.postRaw(h, []byte(`{"n":1}`))
	}

	a := post("pia", "respond-async, wait=30", "pia-1")
	resp, _ := a.Body["response"].(map[string]any)
	if a.Status != http.StatusOK || a.str("status") != "delivered" || a.Header.Get("Preference-Applied") != "wait=30" ||
		resp == nil || resp["status"] != float64(201) || resp["body"] != `{"echo":"`+a.str("id")+`"}` {
		t.Fatalf("inline: %d %v %v, want 200 delivered with raven's answer and Preference-Applied wait=30", a.Status, a.Header, a.Body)
	}
	again := post("pia", "wait=30", "pia-1")
	if again.Status != http.StatusOK || again.str("id") != a.str("id") || again.str("status") != "delivered" {
		t.Fatalf("the same key again: %d %v, want the same request's 200", again.Status, again.Body)
	}
	if capped := post("pia", "wait=3600", ""); capped.Status != http.StatusOK || capped.Header.Get("Preference-Applied") != "wait=60" {
		t.Fatalf("a wait over MAX_STATUS_WAIT: %d %v, want 200 held for at most 60 s", capped.Status, capped.Header)
	}

	start := time.Now()
	late := post("slow", "wait=1", "")
	if took := time.Since(start); late.Status != http.StatusAccepted || late.Header.Get("Preference-Applied") != "wait=1" || late.str("status") != "queued" || took < time.Second {
		t.Fatalf("a wait that ends first: %d %v %v after %s, want the 202 after a second, saying it waited", late.Status, late.Header, late.Body, took)
	}
	if plain := post("pia", "", ""); plain.Status != http.StatusAccepted || plain.Header.Get("Preference-Applied") != "" {
		t.Fatalf("without Prefer: %d %v, want a 202 at once", plain.Status, plain.Header)
	}

	before := s.storedEver()
	for _, bad := range []string{"wait=soon", "wait=-1", "wait=1.5", "wait", "wait=1, wait=2"} {
		if b := post("pia", bad, ""); b.Status != http.StatusBadRequest || b.str("code") != "prefer_wait_invalid" {
			t.Errorf("Prefer: %s: %d %v, want 400 prefer_wait_invalid", bad, b.Status, b.Body)
		}
	}
	if after := s.storedEver(); after != before {
		t.Errorf("the refused POSTs stored %d requests", after-before)
	}
	s.finish(30*time.Second, 0)
}

// The Go client's Do on a real ingest, dispatcher and raven: each call returns raven's
// own answer to its request, the calls of one client spaced by the interval (the ledger
// check), and a refusal comes back as the dead letter with raven's reason.
func TestClientDoReturnsRavensAnswer(t *testing.T) {
	t.Parallel()
	s := newStack(t, options{interval: 300 * time.Millisecond, respond: func(a ledger.Arrival) ledger.Response {
		if a.ClientID == "bad" {
			return ledger.Response{Status: 400, ContentType: "text/plain", Body: []byte("unknown fish")}
		}
		return ledger.Response{Status: 200, ContentType: "application/json", Body: []byte(`{"for":"` + a.ID + `"}`)}
	}})
	c := goClient(t, s.ingestBase())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type result struct {
		st  client.Status
		err error
	}
	results := make(chan result, 3)
	for range 3 {
		go func() {
			st, err := c.Do(ctx, "rex", []byte(`{"fish":1}`))
			results <- result{st, err}
		}()
	}
	seqs := map[string]uint64{}
	for range 3 {
		r := <-results
		if r.err != nil || r.st.State != client.StatusDelivered || r.st.Response == nil || r.st.Response.Text != `{"for":"`+r.st.ID+`"}` {
			t.Fatalf("Do: %+v (%v), want delivered with raven's answer to this request", r.st, r.err)
		}
		events, err := s.q.Events(ctx, "rex", r.st.ID)
		for _, e := range events {
			seqs[r.st.ID] = max(seqs[r.st.ID], e.Seq)
		}
		if err != nil || seqs[r.st.ID] == 0 {
			t.Fatalf("the queue sequence of %s: %v (%v)", r.st.ID, events, err)
		}
	}
	// The ledger checks order against the order of acceptance: the queue's, not the
	// order the calls returned in (on a loaded machine a call can return after the next
	// request's), nor their acceptedAt (tried: not in the queue's order here).
	ids := slices.Collect(maps.Keys(seqs))
	slices.SortFunc(ids, func(a, b string) int { return cmp.Compare(seqs[a], seqs[b]) })
	s.accept("rex", ids...)
	st, err := c.Do(ctx, "bad", []byte(`{"fish":2}`))
	if err != nil || st.State != client.StatusDeadLettered || st.DeadLetter == nil || st.Response == nil || st.Response.Status != 400 || st.Response.Text != "unknown fish" {
		t.Fatalf("Do refused by raven: %+v (%v), want dead-lettered with raven's 400 and its reason", st, err)
	}
	s.accept("bad", st.ID)
	s.finish(15*time.Second, 0)
}
