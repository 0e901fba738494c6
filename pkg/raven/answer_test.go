package raven_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/penguinhq/dispatcher/pkg/raven"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// Raven's answer is kept as far as the settings say: its status always, the chosen
// headers, and the body up to KeepBytes, as text when it is UTF-8 and base64 when not,
// marked truncated when cut.
func TestSendAnswerKeepsWhatIsAsked(t *testing.T) {
	t.Parallel()
	binary := []byte{0xff, 0x00, 0xfe, 'x'}
	long := strings.Repeat("é", 100) // 200 bytes: cut at 51 must not split a character
	answers := map[string]func(w http.ResponseWriter){
		"/json": func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Add("X-Trace", "a")
			w.Header().Add("X-Trace", "b")
			w.Header().Set("X-Secret", "not kept")
			w.WriteHeader(201)
			_, _ = w.Write([]byte(`{"order":"o-1","ok":true}`))
		},
		"/binary": func(w http.ResponseWriter) { w.WriteHeader(200); _, _ = w.Write(binary) },
		"/long":   func(w http.ResponseWriter) { w.WriteHeader(400); _, _ = w.Write([]byte(long)) },
		"/html":   func(w http.ResponseWriter) { w.WriteHeader(503); _, _ = w.Write(bytes.Repeat([]byte("<&>"), 10)) },
		"/ctrl":   func(w http.ResponseWriter) { w.WriteHeader(503); _, _ = w.Write(bytes.Repeat([]byte("\x01\x02"), 10)) },
		"/empty":  func(w http.ResponseWriter) { w.WriteHeader(204) },
		"/chunked": func(w http.ResponseWriter) {
			_, _ = w.Write([]byte("part one, "))
			http.NewResponseController(w).Flush() // no Content-Length: sent in chunks
			_, _ = w.Write([]byte("part two"))
		},
		"/broken": func(w http.ResponseWriter) { // says 100 bytes, sends 10
			w.Header().Set("Content-Length", "100")
			_, _ = w.Write([]byte("0123456789"))
		},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { answers[r.URL.Path](w) }))
	defer srv.Close()
	send := func(path string, keep int, headers ...string) *request.Response {
		t.Helper()
		rc, err := raven.New(raven.Config{URL: srv.URL + path, KeepBytes: keep, KeepHeaders: headers})
		if err != nil {
			t.Fatal(err)
		}
		answer, _ := rc.SendAnswer(context.Background(), request.Stored{Request: request.Request{ID: "r1", ClientID: "bob"}}, 1)
		if answer == nil {
			t.Fatalf("%s: no answer kept", path)
		}
		return answer
	}

	a := send("/json", 1024, "content-type", "X-Trace", "X-Absent")
	if a.Status != 201 || a.Body != `{"order":"o-1","ok":true}` || a.BodyEncoding != "" || a.Truncated || a.BodyBytes != 25 {
		t.Errorf("json answer: %+v", a)
	}
	if len(a.Headers) != 2 || a.Headers["Content-Type"] != "application/json" || a.Headers["X-Trace"] != "a, b" {
		t.Errorf("kept headers %v, want Content-Type and both X-Trace values only", a.Headers)
	}

	a = send("/binary", 1024)
	got, err := a.Bytes()
	if a.BodyEncoding != request.BodyBase64 || err != nil || !bytes.Equal(got, binary) || a.Headers != nil {
		t.Errorf("binary answer: %+v (%q, %v), want it base64 and no headers", a, got, err)
	}

	a = send("/long", 51)
	if a.Status != 400 || !a.Truncated || a.BodyBytes != 50 || a.Body != long[:50] {
		t.Errorf("long answer cut at 51: %+v, want the 25 whole characters and truncated", a)
	}

	// Text whose JSON would be six times its size is kept as base64; HTML is text.
	a = send("/ctrl", 1024)
	if got, _ := a.Bytes(); a.BodyEncoding != request.BodyBase64 || string(got) != strings.Repeat("\x01\x02", 10) {
		t.Errorf("control characters' answer: %+v", a)
	}
	if a := send("/html", 1024); a.BodyEncoding != "" || a.Body != strings.Repeat("<&>", 10) {
		t.Errorf("html answer: %+v", a)
	}

	a = send("/json", 0, "Content-Type")
	if a.Status != 201 || a.Body != "" || a.BodyBytes != 0 || a.Truncated || a.Headers["Content-Type"] != "application/json" {
		t.Errorf("with no body kept: %+v, want the status and the header only", a)
	}
	if a := send("/empty", 1024); a.Status != 204 || a.Body != "" || a.Truncated {
		t.Errorf("empty answer: %+v", a)
	}

	if a := send("/chunked", 12); a.Body != "part one, pa" || !a.Truncated {
		t.Errorf("chunked answer cut at 12: %+v", a)
	}
	if a := send("/chunked", 1024); a.Body != "part one, part two" || a.Truncated {
		t.Errorf("chunked answer: %+v", a)
	}
	if a := send("/broken", 1024); a.Body != "0123456789" || !a.Truncated {
		t.Errorf("an answer that broke off: %+v, want what came, truncated", a)
	}
	if a := send("/broken", 5); a.Body != "01234" || !a.Truncated {
		t.Errorf("an answer that broke off, cut at 5: %+v", a)
	}

	for _, bad := range []raven.Config{
		{URL: srv.URL, KeepBytes: -1}, {URL: srv.URL, KeepBytes: request.MaxAnswerBytes + 1}, {URL: srv.URL, KeepHeaders: []string{"Content Type"}},
	} {
		if _, err := raven.New(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
