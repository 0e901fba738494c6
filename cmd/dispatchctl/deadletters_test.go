package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// A dead letter raven answered says so where the last error goes: the table's LAST
// ERROR is raven's status (it was "-"), and -body shows raven's answer, headers and
// body, from the request's events (the dead-letter stream keeps only the status); as
// JSON too. One whose answer the events no longer hold says where it went.
func TestDeadLettersShowRavensAnswer(t *testing.T) {
	s := newStandalone(t)
	ctx := context.Background()
	answered, forgotten := request.NewID(time.Now()), request.NewID(time.Now())
	s.publish(t, "alice", answered)
	s.bury(t, "alice", 1) // raven's last status 400
	s.publish(t, "bob", forgotten)
	s.bury(t, "bob", 1)
	answer := request.NewResponse(400, http.Header{"Content-Type": {"text/plain"}}, []string{"Content-Type"}, []byte("unknown fish"), false)
	if err := s.q.WriteEvent(ctx, request.Event{Type: request.EventDeadLettered, ID: answered, ClientID: "alice", Attempt: 1,
		Status: 400, Reason: request.ReasonPermanent, Response: answer}); err != nil {
		t.Fatal(err)
	}
	code, out, errs := s.ctl(t, "deadletters", "-nats-url", s.url)
	if code != exitOK || strings.Count(out, "raven answered 400 Bad Request\n") != 2 {
		t.Errorf("deadletters: exit %d, want each row's LAST ERROR to say raven answered 400 Bad Request:\n%s\n%s", code, out, errs)
	}
	code, out, errs = s.ctl(t, "deadletters", "-nats-url", s.url, "-body")
	for _, want := range []string{
		"raven answered 400 Bad Request, Content-Type: text/plain:\nunknown fish\n",
		"raven answered 400 Bad Request (its answer is not in the request's events",
	} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Errorf("deadletters -body: exit %d, want %q:\n%s\n%s", code, want, out, errs)
		}
	}
	code, out, _ = s.ctl(t, "deadletters", "-nats-url", s.url, "-body", "-json")
	var page admin.DeadLettersPage[admin.DeadLetterBody]
	if err := json.Unmarshal([]byte(out), &page); err != nil || code != exitOK || len(page.DeadLetters) != 2 {
		t.Fatalf("deadletters -body -json: exit %d, %v:\n%s", code, err, out)
	}
	for _, d := range page.DeadLetters {
		if got := d.RavenAnswer; (d.ID == answered) != (got != nil) || got != nil && got.Body != "unknown fish" {
			t.Errorf("dead letter %s as JSON: raven's answer %+v; want alice's only, with its body", d.ID, got)
		}
	}
}
