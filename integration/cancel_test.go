package integration

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/client"
	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/ledger"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// DELETE /v1/requests/{id} on real ingest, dispatcher and raven: a cancel of a request
// queued behind one in flight wins (200 cancelled, and raven never receives it), a
// cancel of the one in flight loses (409 in_flight), and once it is delivered one loses
// too (409 not_cancellable); a cancel asked again reads the same 200; the Go client and
// the admin API cancel as well; an unknown id is a 404, a malformed one or a missing
// clientId a 400. The ledger check ends it: the cancelled requests never reached raven,
// and the others went in order, spaced.
func TestCancelWinsWhileQueuedAndLosesInFlight(t *testing.T) {
	t.Parallel()
	var vics atomic.Int32
	held := make(chan struct{})
	s := newStack(t, options{interval: 200 * time.Millisecond, timeout: 30 * time.Second, respond: func(a ledger.Arrival) ledger.Response {
		if a.ClientID == "vic" && vics.Add(1) == 1 { // the first: raven holds it until the test lets go
			<-held
		}
		return ledger.Response{Status: 200, Body: []byte(`{"ok":true}`), ContentType: "application/json"}
	}})
	post := func(n int) string {
		t.Helper()
		h := jsonHeader()
		h.Set("X-Client-Id", "vic")
		a := s.postRaw(h, []byte(`{"n":`+string(rune('0'+n))+`}`))
		if a.Status != http.StatusAccepted {
			t.Fatalf("post %d: %d %v", n, a.Status, a.Body)
		}
		return a.str("id")
	}
	first := post(1)
	waitFor(t, 30*time.Second, "raven to hold the first request", func() bool { return vics.Load() == 1 })
	second, third, fourth, fifth := post(2), post(3), post(4), post(5)
	released := false
	release := func() {
		if !released {
			released = true
			close(held)
		}
	}
	defer release()

	if a := s.cancel("vic", first); a.Status != http.StatusConflict || a.str("code") != "in_flight" {
		t.Fatalf("cancel of the request raven holds: %d %v, want 409 in_flight", a.Status, a.Body)
	}
	a := s.cancel("vic", second)
	if a.Status != http.StatusOK || a.str("status") != "cancelled" || a.str("cancelledAt") == "" || a.str("clientId") != "vic" || a.str("acceptedAt") == "" {
		t.Fatalf("cancel of a request queued behind it: %d %v, want 200 cancelled", a.Status, a.Body)
	}
	if again := s.cancel("vic", second); again.Status != http.StatusOK || again.str("status") != "cancelled" {
		t.Fatalf("the same cancel again: %d %v, want the same 200 cancelled", again.Status, again.Body)
	}
	c := goClient(t, s.ingestBase())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	asked := time.Now()
	if st, err := c.Cancel(ctx, "vic", fourth); err != nil || st.State != client.StatusCancelled || !st.Final() || st.CancelledAt.IsZero() {
		t.Fatalf("the Go client's Cancel: %+v, %v; want cancelled", st, err)
	}
	s.cancelledAsked(fourth, asked)
	ctl, err := s.q.Control(ctx, testLog())
	if err != nil {
		t.Fatal(err)
	}
	svc, err := admin.New(admin.Config{Queue: s.q, Control: ctl, Log: testLog(), Instance: "ops"})
	if err != nil {
		t.Fatal(err)
	}
	asked = time.Now()
	if out, err := svc.Cancel(ctx, "vic", fifth); err != nil || out.State != admin.StateCancelled || out.Record == nil {
		t.Fatalf("the admin API's cancel: %+v, %v; want cancelled", out, err)
	}
	s.cancelledAsked(fifth, asked)
	if _, err := svc.Cancel(ctx, "vic", first); !errors.Is(err, admin.ErrConflict) {
		t.Fatalf("the admin API's cancel of the request in flight: %v, want a conflict", err)
	}

	// Bad input: a 4xx that says what to change, and nothing queued is touched.
	if a := s.cancel("vic", "not-an-id"); a.Status != http.StatusBadRequest || a.str("code") != "id_invalid" {
		t.Errorf("a malformed id: %d %v, want 400 id_invalid", a.Status, a.Body)
	}
	if a := s.cancel("", third); a.Status != http.StatusBadRequest || a.str("code") != "client_id_missing" {
		t.Errorf("no clientId: %d %v, want 400 client_id_missing", a.Status, a.Body)
	}
	if a := s.cancel("vic", request.NewID(time.Now())); a.Status != http.StatusNotFound || a.str("code") != "not_found" {
		t.Errorf("an id never accepted: %d %v, want 404 not_found", a.Status, a.Body)
	}
	if a := s.cancel("wes", third); a.Status != http.StatusNotFound {
		t.Errorf("the id under another client: %d %v, want 404", a.Status, a.Body)
	}

	release()
	for _, id := range []string{first, third} {
		if st, err := c.Wait(ctx, "vic", id); err != nil || st.State != client.StatusDelivered {
			t.Fatalf("%s: %+v, %v; want delivered", id, st, err)
		}
	}
	if st, err := c.Status(ctx, "vic", second); err != nil || st.State != client.StatusCancelled {
		t.Fatalf("the cancelled request's status: %+v, %v; want cancelled", st, err)
	}
	if a := s.cancel("vic", first); a.Status != http.StatusConflict || a.str("code") != "not_cancellable" {
		t.Fatalf("cancel of a delivered request: %d %v, want 409 not_cancellable", a.Status, a.Body)
	}
	for _, got := range arrivalsOf(s.ledger, "vic") {
		if got.ID == second || got.ID == fourth || got.ID == fifth {
			t.Fatalf("raven received %s, which was cancelled", got.ID)
		}
	}
	s.finish(30*time.Second, 0)
}
