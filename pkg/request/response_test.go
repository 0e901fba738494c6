package request_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

func TestResponseCut(t *testing.T) {
	t.Parallel()
	text := request.NewResponse(200, nil, nil, []byte("aé"+strings.Repeat("x", 10)), false) // 'é' is bytes 1-2
	if c := text.Cut(2); c.Body != "a" || !c.Truncated || c.BodyBytes != 1 || text.Truncated {
		t.Errorf("text cut at 2: %+v (the original %+v), want the character left out whole", c, text)
	}
	if c := text.Cut(100); c != text {
		t.Errorf("a short body cut: %+v, want it as it is", c)
	}
	bin := request.NewResponse(500, nil, nil, []byte{0xff, 1, 2, 3, 4}, false)
	c := bin.Cut(3)
	if got, err := c.Bytes(); err != nil || len(got) != 3 || got[0] != 0xff || c.BodyEncoding != request.BodyBase64 || !c.Truncated {
		t.Errorf("binary cut at 3: %+v", c)
	}
	var none *request.Response
	if none.Cut(3) != nil {
		t.Error("no answer cut is an answer")
	}
	h := http.Header{"Content-Type": {strings.Repeat("z", 5000)}}
	if r := request.NewResponse(200, h, []string{"Content-Type"}, nil, false); len(r.Headers["Content-Type"]) != 1024 {
		t.Errorf("a kept header of 5000 bytes kept as %d", len(r.Headers["Content-Type"]))
	}
}

// Whatever raven answers, the event carrying its kept body stays within twice the kept
// size (plus the rest of the event): it must fit in one NATS message.
func TestAnswerEventSizeIsBounded(t *testing.T) {
	t.Parallel()
	for _, body := range [][]byte{
		[]byte(strings.Repeat("<", request.MaxAnswerBytes)),
		[]byte(strings.Repeat("\x01", request.MaxAnswerBytes)),
		[]byte(strings.Repeat("\"", request.MaxAnswerBytes)),
		[]byte(strings.Repeat("\u2028", request.MaxAnswerBytes/3)),
	} {
		ev := request.Event{Type: request.EventDelivered, ID: "x", At: time.Now(), Response: request.NewResponse(200, nil, nil, body, false)}
		if b := ev.JSON(); len(b) > 2*len(body)+512 {
			t.Errorf("body of %q...: event of %d bytes, want at most %d", body[:3], len(b), 2*len(body)+512)
		}
	}
}

// A status shows raven's answer to the latest attempt it answered.
func TestStatusShowsTheLatestAnswer(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	failed := request.NewResponse(503, nil, nil, []byte("busy"), false)
	ok := request.NewResponse(201, nil, nil, []byte(`{"ok":true}`), false)
	events := []request.Event{
		{Type: request.EventAccepted, ID: "r", ClientID: "c", At: at, Seq: 4},
		{Type: request.EventAttemptFailed, ID: "r", ClientID: "c", At: at.Add(time.Second), Attempt: 1, Status: 503, Seq: 4, Response: failed},
	}
	if st := request.StatusOf("r", events); st.State != request.StateQueued || st.Response != failed {
		t.Errorf("while retried: %+v, want the failed attempt's answer", st)
	}
	events = append(events, request.Event{Type: request.EventAttemptStarted, ID: "r", ClientID: "c", At: at.Add(2 * time.Second), Attempt: 2, Seq: 4})
	if st := request.StatusOf("r", events); st.State != request.StateInFlight || st.Response != failed {
		t.Errorf("in flight again: %+v, want the last answer still", st)
	}
	events = append(events, request.Event{Type: request.EventDelivered, ID: "r", ClientID: "c", At: at.Add(3 * time.Second), Attempt: 2, Status: 201, Seq: 4, Response: ok})
	st := request.StatusOf("r", events)
	if st.State != request.StateDelivered || st.Response != ok {
		t.Errorf("delivered: %+v, want the delivery's answer", st)
	}
	b, _ := json.Marshal(st)
	if !strings.Contains(string(b), `"response":{"status":201,"body":"{\"ok\":true}","bodyBytes":11}`) {
		t.Errorf("status document %s", b)
	}
}

// Bytes that are not text stay whole when cut: only a character cut in two is dropped.
func TestCutBinaryIsNotTakenForText(t *testing.T) {
	t.Parallel()
	for _, body := range [][]byte{{0xff, 0xfe}, []byte("abc\xff"), []byte("abc\xe2\x82")} {
		r := request.NewResponse(200, nil, nil, body, true)
		got, _ := r.Bytes()
		want := body
		if string(body) == "abc\xe2\x82" {
			want = []byte("abc") // the start of "€" cut off
		}
		if string(got) != string(want) {
			t.Errorf("%q kept as %q (%s), want %q", body, got, r.BodyEncoding, want)
		}
	}
}

// An event with raven's answer fits any limit a server's max_payload sets: the body is
// cut, then the headers go; the status stays.
func TestEventFitsItsLimit(t *testing.T) {
	t.Parallel()
	h := http.Header{"Content-Type": {"text/plain"}, "X-Big": {strings.Repeat("h", 5000)}}
	body := []byte(strings.Repeat("\"é", 100_000)) // quotes: twice their size in JSON
	ev := request.Event{Type: request.EventDelivered, ID: "x", ClientID: "c", At: time.Now(),
		Response: request.NewResponse(200, h, []string{"Content-Type", "X-Big"}, body, false)}
	for _, limit := range []int{1 << 20, 64 << 10, 2 << 10, 300} {
		got := ev.Fit(limit)
		if n := len(got.JSON()); n > limit && (got.Response.BodyBytes > 0 || len(got.Response.Headers) > 0) {
			t.Errorf("limit %d: %d bytes, with %d bytes of body and %d headers left", limit, n, got.Response.BodyBytes, len(got.Response.Headers))
		}
		if got.Response.Status != 200 {
			t.Errorf("limit %d: the status went", limit)
		}
		if len(got.JSON()) < len(ev.JSON()) && !got.Response.Truncated {
			t.Errorf("limit %d: cut, but not marked truncated", limit)
		}
	}
	if small := ev.Fit(1 << 30); small.Response != ev.Response {
		t.Error("an event that fits was changed")
	}
	if ev.Response.BodyBytes != len(body) {
		t.Error("Fit changed the event it was given")
	}
}
