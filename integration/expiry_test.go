package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/client"
	"github.com/penguinhq/dispatcher/pkg/ledger"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// A request whose Not-After passes before an attempt starts is never sent: queued behind
// a slow attempt, it is dead-lettered as expired and raven never sees it; the request
// behind it goes on. The slow attempt itself, under way at its own deadline, is not cut
// short. A deadline not ahead, before Not-Before, or unreadable is a 400 that stores
// nothing; a batch item takes notAfter too.
func TestNotAfterExpiresUnsent(t *testing.T) {
	t.Parallel()
	var tias atomic.Int32
	slowArrived := make(chan time.Time, 1)
	s := newStack(t, options{interval: 100 * time.Millisecond, timeout: 20 * time.Second, respond: func(a ledger.Arrival) ledger.Response {
		if a.ClientID == "tia" && tias.Add(1) == 1 { // the first: raven takes 6 s over it
			slowArrived <- a.Start
			return ledger.Response{Status: 200, Delay: 6 * time.Second}
		}
		return ledger.Response{}
	}})
	post := func(body string, h ...string) answer {
		t.Helper()
		hdr := http.Header{"Content-Type": {"application/json"}, "X-Client-Id": {"tia"}}
		for i := 0; i < len(h); i += 2 {
			hdr.Set(h[i], h[i+1])
		}
		return s.postRaw(hdr, []byte(body))
	}
	slow := post(`{"n":1}`, "Not-After", "3") // under way at its deadline: delivered all the same
	select {
	case <-slowArrived:
	case <-time.After(10 * time.Second):
		// Its attempt could not start within its 3 s: it expired (or will) unsent, which
		// is the behaviour under test below, but not the case this test sets up.
		t.Skip("the machine could not start the first attempt within its 3 s deadline; nothing to check")
	}
	doomed := post(`{"n":2}`, "Not-After", "3")  // behind the 6 s attempt: expires unsent
	after := post(`{"n":3}`, "Not-After", "600") // goes after the expired one
	for _, a := range []answer{slow, doomed, after} {
		if a.Status != http.StatusAccepted {
			t.Fatalf("post: %d %v", a.Status, a.Body)
		}
	}
	c := goClient(t, s.ingestBase())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := c.Wait(ctx, "tia", doomed.str("id"))
	if err != nil || st.State != client.StatusDeadLettered || st.DeadLetter == nil || st.DeadLetter.Reason != string(request.ReasonExpired) || st.NotAfter.IsZero() || st.Attempts != 0 {
		t.Fatalf("the request behind the slow one: %+v %+v (%v), want dead-lettered, expired, unsent", st, st.DeadLetter, err)
	}
	for _, a := range []answer{slow, after} {
		if st, err := c.Wait(ctx, "tia", a.str("id")); err != nil || st.State != client.StatusDelivered {
			t.Fatalf("%s: %+v (%v), want delivered", a.str("id"), st, err)
		}
	}
	for _, a := range arrivalsOf(s.ledger, "tia") {
		if a.ID == doomed.str("id") {
			t.Fatalf("raven received the expired request at %s", a.Start)
		}
	}
	if dl := s.dead(); !dl[doomed.str("id")] {
		t.Fatalf("the expired request is not in the dead-letter stream: %v", dl)
	}

	before := s.storedEver()
	past := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	soon, later := time.Now().Add(time.Minute).UTC().Format(time.RFC3339), time.Now().Add(2*time.Minute).UTC().Format(time.RFC3339)
	for _, bad := range [][]string{{"Not-After", past}, {"Not-After", "0"}, {"Not-After", "tomorrow"}, {"Not-After", soon, "Not-Before", later}} {
		if a := post(`{"n":9}`, bad...); a.Status != http.StatusBadRequest || a.str("code") != "not_after_invalid" {
			t.Errorf("%v: %d %v, want 400 not_after_invalid", bad, a.Status, a.Body)
		}
	}
	var refused *client.Problem
	if _, err := c.Submit(ctx, "tia", []byte(`{"n":8}`), client.WithNotAfter(time.Now().Add(-time.Minute))); !errors.As(err, &refused) || refused.Code != "not_after_invalid" {
		t.Errorf("the Go client's WithNotAfter in the past: %v, want ingest's not_after_invalid", err)
	}
	if got := s.storedEver(); got != before {
		t.Errorf("the refused requests stored %d", got-before)
	}
	code, _, body := postBatch(t, s.http, s.ingestBase(), "application/x-ndjson",
		[]byte(fmt.Sprintf("{\"clientId\":\"uma\",\"body\":{},\"notAfter\":600}\n{\"clientId\":\"uma\",\"body\":{},\"notAfter\":%q}\n", past)))
	results, _ := body["results"].([]any)
	if code != http.StatusOK || len(results) != 2 || results[0].(map[string]any)["status"] != "queued" ||
		results[1].(map[string]any)["problem"].(map[string]any)["code"] != "not_after_invalid" {
		t.Fatalf("batch: %d %v, want the first item queued and the second refused not_after_invalid", code, body)
	}
	s.accept("uma", results[0].(map[string]any)["id"].(string))
	// The Go client's Item.NotAfter is the batch item's notAfter: ingest reads it (a
	// deadline in the past is refused) and keeps it (the status says it).
	deadline := time.Now().Add(10 * time.Minute).Truncate(time.Millisecond)
	items, err := c.SubmitBatch(ctx, []client.Item{
		{ClientID: "uma", Body: []byte(`{}`), NotAfter: deadline},
		{ClientID: "uma", Body: []byte(`{}`), NotAfter: time.Now().Add(-time.Minute)},
	})
	if err != nil || items[0].Err != nil || !errors.As(items[1].Err, &refused) || refused.Code != "not_after_invalid" {
		t.Fatalf("the Go client's batch with NotAfter: %v %+v, want the first stored and the second refused not_after_invalid", err, items)
	}
	s.accept("uma", items[0].Receipt.ID)
	if st, err := c.Wait(ctx, "uma", items[0].Receipt.ID); err != nil || st.State != client.StatusDelivered || !st.NotAfter.Equal(deadline) {
		t.Fatalf("the item with NotAfter %s: %+v (%v), want delivered, with that NotAfter", deadline, st, err)
	}
	s.finish(30*time.Second, 0)
}
