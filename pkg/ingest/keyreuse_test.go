package ingest_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// keyedIngest serves ingest on q and returns how to post a body with carol's
// Idempotency-Key key.
func keyedIngest(t *testing.T, q *queue.Queue, key string) func(body string) answer {
	t.Helper()
	url := serveIngest(t, ingest.Config{Status: q, Live: q}, q)
	return func(body string) answer {
		return call(t, context.Background(), http.MethodPost, url+"/v1/requests", "", body, "X-Client-Id", "carol", "Idempotency-Key", key)
	}
}

// sentAgain checks that the key sent again with another body is refused (409, naming
// the first request) and with the same body is a duplicate of it.
func sentAgain(t *testing.T, when string, post func(string) answer, first answer) {
	t.Helper()
	if a := post(`{"n":2}`); a.Code != 409 || a.Problem != "idempotency_key_reused" || !strings.Contains(a.Detail, first.ID) {
		t.Errorf("%s: the key again with another body: %d %s %q, want 409 idempotency_key_reused naming %s", when, a.Code, a.Problem, a.Detail, first.ID)
	}
	if a := post(`{"n":1}`); a.Code != 202 || !a.Duplicate || a.ID != first.ID {
		t.Errorf("%s: the key again with the same body: %d duplicate=%v, want 202, a duplicate of %s", when, a.Code, a.Duplicate, first.ID)
	}
}

// deliver does what a dispatcher does once raven took carol's request id: its delivered
// event written, with the body's digest of the keyed request, then its removal from the
// queue.
func deliver(t *testing.T, ctx context.Context, q *queue.Queue, id string) {
	t.Helper()
	f, ok, err := q.FindRequest(ctx, id, "carol")
	if err != nil || !ok || f.BodyDigest == "" {
		t.Fatalf("finding %s: %+v %v %v; want it queued, with its body's digest", id, f, ok, err)
	}
	delivered := request.Event{Type: request.EventDelivered, ID: id, ClientID: "carol", Attempt: 1, Status: 200,
		Seq: f.Seq, AcceptedAt: f.AcceptedAt, BodyDigest: f.BodyDigest}
	if err := q.WriteEvent(ctx, delivered); err != nil {
		t.Fatal(err)
	}
	if err := q.Delete(ctx, f.Lane, f.Seq); err != nil {
		t.Fatal(err)
	}
}

// A key sent again with another body while the first copy is queued (it has no stored
// event) is refused from the queued request's headers, which the dispatchers' lookup
// answers.
func TestAKeyReusedWhileQueuedIsRefused(t *testing.T) {
	t.Parallel()
	_, q := embeddedQueue(t) // the dispatchers' lookup answers, as it does
	post := keyedIngest(t, q, "order-7")
	first := post(`{"n":1}`)
	if first.Code != 202 || first.Duplicate {
		t.Fatalf("first: %d duplicate=%v, want 202", first.Code, first.Duplicate)
	}
	sentAgain(t, "queued", post, first)
}

// Once the request has been delivered and left the queue, its delivered event says what
// its body was (ADR 18: a keyed request's final events carry its body's digest).
func TestAKeyReusedAfterItsRequestLeftIsRefusedFromItsRecord(t *testing.T) {
	t.Parallel()
	_, q := embeddedQueue(t)
	ctx := context.Background()
	post := keyedIngest(t, q, "order-8")
	first := post(`{"n":1}`)
	if first.Code != 202 || first.Duplicate {
		t.Fatalf("first: %d duplicate=%v, want 202", first.Code, first.Duplicate)
	}
	deliver(t, ctx, q, first.ID)
	sentAgain(t, "delivered and gone from the queue", post, first)
}

// A keyed request is sent again by penguin after it was delivered, within the duplicate
// window: a duplicate. A status read of a keyed id that started from its latest
// acceptance found no delivery after it, and read queued for the whole retention (the
// soak on e29f24d saw it). No acceptance is stored now (ADR 18): a keyed id's events are
// read from the start of the record.
func TestAKeySentAgainAfterItsDeliveryStillReadsDelivered(t *testing.T) {
	t.Parallel()
	_, q := embeddedQueue(t)
	ctx := context.Background()
	first := keyedIngest(t, q, "order-9")(`{"n":1}`)
	if first.Code != 202 || first.Duplicate {
		t.Fatalf("first: %d duplicate=%v, want 202", first.Code, first.Duplicate)
	}
	deliver(t, ctx, q, first.ID)
	// Sent again after the delivery, by more than the read's margin for clocks apart
	// (half a second).
	time.Sleep(time.Second)
	url := serveIngest(t, ingest.Config{Status: q, Live: q}, q)
	again := call(t, ctx, http.MethodPost, url+"/v1/requests", "", `{"n":1}`, "X-Client-Id", "carol", "Idempotency-Key", "order-9")
	if again.Code != 202 || !again.Duplicate || again.ID != first.ID {
		t.Fatalf("sent again: %d duplicate=%v id %s, want 202, a duplicate of %s", again.Code, again.Duplicate, again.ID, first.ID)
	}
	st := call(t, ctx, http.MethodGet, url+"/v1/requests/"+first.ID+"?clientId=carol", "", "")
	if st.Code != 200 || string(st.Status) != `"delivered"` {
		t.Fatalf("status after the key was sent again: %d %s, want 200 delivered", st.Code, st.Status)
	}
}

// The same with two ingests: the first POST taken by one, the retry after the delivery
// by the other.
func TestAKeySentAgainThroughAnotherIngestStillReadsDelivered(t *testing.T) {
	t.Parallel()
	_, q := embeddedQueue(t)
	ctx := context.Background()
	serve := func(instance string) string {
		return serveIngest(t, ingest.Config{Status: q, Live: q, Instance: instance}, q)
	}
	one, two := serve("ingest-1"), serve("ingest-2")
	post := func(base string) answer {
		return call(t, ctx, http.MethodPost, base+"/v1/requests", "", `{"n":1}`, "X-Client-Id", "carol", "Idempotency-Key", "order-10")
	}
	first := post(one)
	if first.Code != 202 || first.Duplicate {
		t.Fatalf("first: %d duplicate=%v, want 202", first.Code, first.Duplicate)
	}
	deliver(t, ctx, q, first.ID)
	time.Sleep(time.Second) // past the read's margin for clocks
	if again := post(two); again.Code != 202 || !again.Duplicate {
		t.Fatalf("sent again through the other ingest: %d duplicate=%v, want 202, a duplicate", again.Code, again.Duplicate)
	}
	st := call(t, ctx, http.MethodGet, one+"/v1/requests/"+first.ID+"?clientId=carol", "", "")
	if st.Code != 200 || string(st.Status) != `"delivered"` {
		t.Fatalf("status after the key was sent again through the other ingest: %d %s, want 200 delivered", st.Code, st.Status)
	}
}
