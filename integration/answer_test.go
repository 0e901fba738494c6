package integration

import (
	"bytes"
	"context"
	"fmt"
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
