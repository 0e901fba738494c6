package raven_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/raven"
	"github.com/penguinhq/dispatcher/pkg/request"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		status     int
		retryAfter string
		permanent  bool
		transient  bool
		after      time.Duration
	}{
		{200, "", false, false, 0}, {204, "", false, false, 0},
		{400, "", true, false, 0}, {404, "", true, false, 0}, {409, "", true, false, 0}, {302, "", true, false, 0},
		{408, "", false, true, 0}, {425, "", false, true, 0}, {429, "7", false, true, 7 * time.Second},
		{500, "", false, true, 0}, {503, "Thu, 01 Jan 2026 00:00:30 GMT", false, true, 30 * time.Second},
		{503, "-5", false, true, 0}, {503, "soon", false, true, 0},
	}
	for _, c := range cases {
		err := raven.Classify(c.status, c.retryAfter, now)
		var p *raven.PermanentError
		var tr *raven.TransientError
		if errors.As(err, &p) != c.permanent || errors.As(err, &tr) != c.transient {
			t.Errorf("%d: %v, want permanent=%v transient=%v", c.status, err, c.permanent, c.transient)
		}
		if tr != nil && tr.RetryAfter() != c.after {
			t.Errorf("%d Retry-After %q: %s, want %s", c.status, c.retryAfter, tr.RetryAfter(), c.after)
		}
	}
}

func TestSendHeadersAndRedirects(t *testing.T) {
	t.Parallel()
	var got http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/moved" {
			http.Redirect(w, r, "http://example.invalid/", http.StatusFound)
			return
		}
		got = r.Header.Clone()
	}))
	defer srv.Close()
	c, err := raven.New(raven.Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	st := request.Stored{Request: request.Request{ID: "id1", ClientID: "a.b", ContentType: "application/json", Body: []byte("{}")}}
	if err := c.Send(context.Background(), st, 3); err != nil {
		t.Fatal(err)
	}
	if got.Get("Idempotency-Key") != "id1" || got.Get("X-Client-Id") != "a.b" || got.Get("X-Dispatch-Attempt") != "3" || got.Get("Content-Type") != "application/json" {
		t.Fatalf("headers %v", got)
	}
	moved, _ := raven.New(raven.Config{URL: srv.URL + "/moved"})
	var p *raven.PermanentError
	if err := moved.Send(context.Background(), st, 1); !errors.As(err, &p) || p.Status != http.StatusFound {
		t.Fatalf("redirect: %v, want a permanent failure with status 302 (not followed)", err)
	}
	if _, err := raven.New(raven.Config{URL: "ftp://x"}); err == nil {
		t.Fatal("an ftp URL was accepted")
	}
}
