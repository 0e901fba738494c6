package ingest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// clientIDByDecoder is the earlier clientIDFromBody, which decoded every top-level
// value with encoding/json's Decoder: the reference the scanner must agree with.
func clientIDByDecoder(body []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", errNoClientID
	}
	var id string
	found := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", errNoClientID
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return "", errNoClientID
		}
		if k, _ := tok.(string); k != "clientId" && strings.EqualFold(k, "clientId") {
			return "", fmt.Errorf(`the body has the key %q, which JSON readers that ignore case (Go's among them) take for "clientId": spell it "clientId", or rename it`, truncate(k, 64))
		} else if k != "clientId" {
			continue
		}
		if found {
			return "", errors.New(`the body has "clientId" more than once; send it once`)
		}
		found = true
		if len(raw) == 0 || raw[0] != '"' {
			return "", fmt.Errorf(`"clientId" must be a JSON string, not %s`, kindOf(raw))
		}
		if !utf8.Valid(raw) {
			return "", request.ErrClientIDInvalidUTF8
		}
		if err := json.Unmarshal(raw, &id); err != nil {
			return "", errNoClientID
		}
		if replaced(raw, id) {
			return "", errors.New(`"clientId" holds a \u escape that is not a Unicode character (a lone surrogate)`)
		}
	}
	if !found {
		return "", errNoClientID
	}
	return id, nil
}

var clientIDBodies = []string{
	`{"ClientId":"x"}`, `{"clientId":"a","CLIENTID":"b"}`, `{"client\u0049d":"x"}`, `{"clientid":1,"clientId":"a"}`,
	`{"clientId":"alice","n":1}`,
	` { "n" : 1 , "clientId" : "alice" } `,
	"{\n\t\"pad\":\"x\",\r\n\"clientId\":\"a\"}",
	`{"a":"}{","clientId":"x"}`,
	`{"a":["]",{"b":"\"}"}],"clientId":"x","c":{"clientId":"nested"}}`,
	`{"client\u0049d":"escaped key"}`,
	`{"clientId":"esc\u00e9aped \"value\""}`,
	`{"clientId":"\ud800"}`,
	`{"clientId":"\ufffd"}`,
	`{"clientId":"a","clientId":"b"}`,
	`{"clientId":"a","client\u0049d":"b"}`,
	`{"clientId":42}`, `{"clientId":-1.5e3}`, `{"clientId":null}`, `{"clientId":true}`, `{"clientId":false}`,
	`{"clientId":{"a":1}}`, `{"clientId":[1]}`,
	`{"x":{"clientId":"a"}}`, `{}`, `[]`, `"clientId"`, `42`, `null`,
	"{\"clientId\":\"a\xffb\"}",
	`{"n":1e5,"t":true,"f":false,"z":null,"clientId":"after literals"}`,
	`{"clientIdx":"a","xclientId":"b"}`,
	`{"clientId":""}`,
}

// The scanner finds the same clientId, or the same refusal, as the decoder it replaced,
// on every valid JSON body.
func TestClientIDScannerAgreesWithDecoder(t *testing.T) {
	for _, b := range clientIDBodies {
		if !json.Valid([]byte(b)) {
			continue // parse refuses it before looking for a clientId
		}
		checkClientIDAgrees(t, []byte(b))
	}
}

func FuzzClientIDFromBody(f *testing.F) {
	for _, b := range clientIDBodies {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if json.Valid(body) {
			checkClientIDAgrees(t, body)
		}
	})
}

func checkClientIDAgrees(t *testing.T, body []byte) {
	t.Helper()
	got, gotErr := clientIDFromBody(body)
	want, wantErr := clientIDByDecoder(body)
	if got != want || fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
		t.Errorf("body %q: scanner gives %q, %v; decoder gives %q, %v", body, got, gotErr, want, wantErr)
	}
}

// A typical body's clientId costs one allocation (the string) and nothing else.
func TestClientIDScannerAllocations(t *testing.T) {
	body := []byte(`{"clientId":"alice","pad":"` + string(bytes.Repeat([]byte("x"), 400)) + `","n":[1,{"a":"b"}]}`)
	if n := testing.AllocsPerRun(100, func() { _, _ = clientIDFromBody(body) }); n > 1 {
		t.Fatalf("%v allocations per body; want at most 1", n)
	}
}

// An X-Client-Id header and a body's "clientId" that disagree are refused, naming both
// (issue 35, finding 9): taking the header silently let three requests of one body
// client reach raven 0 ms apart under three header clients, and a raven that reads the
// body's clientId saw bob's spacing broken. Agreeing, or either alone, is taken.
func TestHeaderAndBodyClientIDMustAgree(t *testing.T) {
	t.Parallel()
	header := func(id string) http.Header {
		h := http.Header{}
		h.Set(request.HeaderClientID, id)
		return h
	}
	if _, p := clientIDOf(header("mallory"), []byte(`{"clientId":"bob","n":1}`)); p == nil || p.Code != "client_id_mismatch" ||
		p.Status != http.StatusBadRequest || !strings.Contains(p.Detail, `"mallory"`) || !strings.Contains(p.Detail, `"bob"`) {
		t.Errorf("header mallory, body bob: %+v, want 400 client_id_mismatch naming both", p)
	}
	// A clientId in the body that is not a string is refused beside a header too (it was
	// taken for no clientId): a raven reading the body would not find the header's.
	if _, p := clientIDOf(header("bob"), []byte(`{"clientId":7}`)); p == nil || p.Code != "client_id_invalid" {
		t.Errorf(`header bob, body {"clientId":7}: %+v, want 400 client_id_invalid`, p)
	}
	for _, c := range []struct {
		h    http.Header
		body string
		want string
	}{
		{header("bob"), `{"clientId":"bob"}`, "bob"},
		{header("bob"), `{"n":1}`, "bob"},
		{header("bob"), `[1,2]`, "bob"},
		{http.Header{}, `{"clientId":"bob"}`, "bob"},
	} {
		if got, p := clientIDOf(c.h, []byte(c.body)); p != nil || got != c.want {
			t.Errorf("header %q, body %s: %q %+v, want %q", c.h.Get(request.HeaderClientID), c.body, got, p, c.want)
		}
	}
}
