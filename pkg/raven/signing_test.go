package raven_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/raven"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/webhook"
)

// With RAVEN_SIGNING_SECRET set, every attempt carries the Standard Webhooks headers:
// the request id as webhook-id (the Idempotency-Key), the attempt's time, and one
// signature per secret, each of which verifies on its own. Without it, none is sent.
func TestAttemptsAreSigned(t *testing.T) {
	t.Parallel()
	secrets, err := webhook.ParseSecrets("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw whsec_c2Vjb25kLWtleS1vZi10aGlydHktdHdvLWJ5dGVzISE=")
	if err != nil {
		t.Fatal(err)
	}
	type arrival struct {
		h    http.Header
		body []byte
	}
	got := make(chan arrival, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- arrival{r.Header.Clone(), b}
	}))
	defer srv.Close()
	st := request.Stored{Request: request.Request{ID: "01JREQ", ClientID: "alice", ContentType: "application/json", Body: []byte(`{"n":1}`)}}
	send := func(signing []webhook.Secret) (arrival, time.Time, time.Time) {
		t.Helper()
		c, err := raven.New(raven.Config{URL: srv.URL, Signing: signing})
		if err != nil {
			t.Fatal(err)
		}
		before := time.Now()
		if err := c.Send(context.Background(), st, 2); err != nil {
			t.Fatal(err)
		}
		return <-got, before, time.Now()
	}

	a, before, after := send(secrets)
	if a.h.Get("webhook-id") != a.h.Get("Idempotency-Key") || a.h.Get("webhook-id") != "01JREQ" {
		t.Errorf("webhook-id %q, want the Idempotency-Key %q", a.h.Get("webhook-id"), a.h.Get("Idempotency-Key"))
	}
	ts, err := strconv.ParseInt(a.h.Get("webhook-timestamp"), 10, 64)
	if err != nil || ts < before.Unix() || ts > after.Unix() {
		t.Errorf("webhook-timestamp %q, want the attempt's time in unix seconds (%d to %d)", a.h.Get("webhook-timestamp"), before.Unix(), after.Unix())
	}
	if sigs := strings.Fields(a.h.Get("webhook-signature")); len(sigs) != 2 {
		t.Errorf("webhook-signature %q, want one per secret", a.h.Get("webhook-signature"))
	}
	for i, s := range secrets {
		if err := webhook.Verify([]webhook.Secret{s}, a.h, a.body, after); err != nil {
			t.Errorf("secret %d: %v", i+1, err)
		}
	}

	a, _, _ = send(nil)
	for _, h := range []string{"webhook-id", "webhook-timestamp", "webhook-signature"} {
		if v := a.h.Get(h); v != "" {
			t.Errorf("unsigned, the attempt still carries %s: %q", h, v)
		}
	}
}

// A raven URL that is not valid is refused without repeating it: it may carry a
// password or a key.
func TestConfigErrorHidesTheURL(t *testing.T) {
	t.Parallel()
	_, err := raven.New(raven.Config{URL: "ftp://svcuser:pa55word@raven.example/hook?api_key=SECRET"})
	if err == nil {
		t.Fatal("an ftp URL was accepted")
	}
	for _, secret := range []string{"svcuser", "pa55word", "SECRET"} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("the error %q shows %q", err, secret)
		}
	}
}
