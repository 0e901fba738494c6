package client_test

import (
	"errors"
	"go/parser"
	"go/token"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/client"
)

// The package doc (what `go doc ./client` shows first) presents Do, penguin's call to
// raven, beside Submit and Wait: a newcomer reading it did not learn that Do exists.
func TestPackageDocPresentsDo(t *testing.T) {
	t.Parallel()
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	if f.Doc == nil || !strings.Contains(f.Doc.Text(), "c.Do(ctx, ") {
		t.Fatalf("the package doc does not show a call of Do:\n%s", f.Doc.Text())
	}
}

// A nil *Response (a status without raven's answer: expired unsent, purged, not yet
// answered) has a nil body, not a panic.
func TestNilResponseHasNoBody(t *testing.T) {
	t.Parallel()
	var r *client.Response
	body, err := r.Body()
	if body != nil || err != nil {
		t.Fatalf("(*Response)(nil).Body() = %q, %v; want nil, nil", body, err)
	}
}

// Item.NotAfter is sent as the batch item's notAfter, an RFC 3339 time in UTC, as
// WithNotAfter sends a single request's Not-After.
func TestSubmitBatchSendsNotAfter(t *testing.T) {
	t.Parallel()
	var items []batchItem
	ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
		items = decodeBatch(t, body)
		var results []map[string]any
		for i, it := range items {
			results = append(results, queuedResult(i, it))
		}
		writeBatchAnswer(w, results)
	})
	c := newTestClient(t, ingest)
	deadline := time.Date(2030, 1, 2, 3, 4, 5, 6000, time.FixedZone("CET", 3600))
	results, err := c.SubmitBatch(testContext(t, 10*time.Second), []client.Item{
		{ClientID: "penguin-7", Body: []byte(`{}`), NotAfter: deadline},
		{ClientID: "penguin-7", Body: []byte(`{}`)},
	})
	if err != nil || results[0].Err != nil || results[1].Err != nil {
		t.Fatalf("SubmitBatch: %v %+v", err, results)
	}
	if len(items) != 2 || items[0].NotAfter != "2030-01-02T02:04:05.000006Z" || items[1].NotAfter != "" {
		t.Fatalf("items sent = %+v; want the first with notAfter 2030-01-02T02:04:05.000006Z, the second without", items)
	}
}

// Wait with a clientId ingest holds no such request for (a wrong case: clientIds are
// case-sensitive) returns at once, saying so, instead of asking until ctx ends.
func TestWaitStopsAtUnknown(t *testing.T) {
	t.Parallel()
	ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) {
		writeJSON(w, http.StatusOK, map[string]any{"id": "req-1", "status": "unknown"})
	})
	c := newTestClient(t, ingest)
	s, err := c.Wait(testContext(t, 10*time.Second), "Penguin-7", "req-1")
	if !errors.Is(err, client.ErrNoSuchRequest) || s.State != client.StatusUnknown {
		t.Fatalf("Wait = %+v, %v; want unknown and ErrNoSuchRequest", s, err)
	}
	for _, want := range []string{`"Penguin-7"`, "case-sensitive", "retention"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Wait's error %q does not say %s", err, want)
		}
	}
	if n := len(ingest.Calls()); n != 1 {
		t.Errorf("ingest got %d calls; want 1", n)
	}
}

// Do with a nil body says what is wrong with the call, sends nothing, and does not
// advise sending again with an Idempotency-Key: nothing was sent.
func TestDoWithNilBodySaysSo(t *testing.T) {
	t.Parallel()
	ingest := newFakeIngest(t, func(n int, w http.ResponseWriter, r *http.Request, body []byte) { writeQueued(w, r) })
	c := newTestClient(t, ingest)
	_, err := c.Do(testContext(t, 10*time.Second), "olga", nil)
	var ns *client.NotSubmittedError
	if !errors.Is(err, client.ErrBodyNotJSON) || errors.As(err, &ns) {
		t.Fatalf("Do with a nil body: %v; want ErrBodyNotJSON, not a *NotSubmittedError", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "empty") || strings.Contains(msg, "send again") || strings.Contains(msg, "Idempotency-Key") {
		t.Errorf("Do's error %q; want it to say the body is empty, with no advice to send again", msg)
	}
	if n := len(ingest.Calls()); n != 0 {
		t.Errorf("ingest got %d calls; want none", n)
	}
}
