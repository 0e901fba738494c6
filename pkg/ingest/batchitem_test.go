package ingest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/penguinhq/dispatcher/pkg/request"
)

var batchItems = []string{
	`{"clientId":"a","body":{"x":1}}`,
	` { "clientId" : "a" , "body" : [1,"]"] , "idempotencyKey" : "k" , "notBefore" : 30 } `,
	`{"clientId":"a","body":{},"notBefore":"2026-12-24T18:00:00Z"}`,
	`{"client\u0049d":"escaped key","body":1}`,
	`{"clientId":"esc\u00e9","body":"s"}`,
	`{"clientId":"\ud800","body":1}`, `{"clientId":"\ufffd","body":1}`, "{\"clientId\":\"a\xffb\",\"body\":1}",
	`{"clientId":"","body":1}`, `{"clientId":1,"body":1}`, `{"clientId":null}`, `{"clientId":"a","clientId":"b"}`,
	`{"body":1,"body":2}`, `{"other":1}`, `{"clientId":"a","extra":{"clientId":"b"}}`,
	`{"idempotencyKey":7}`, `{"notBefore":true}`, `{"notBefore":-1.5}`, `{"notBefore":"\u0031"}`,
	`{"clientId":"a","body":1,"notAfter":60}`, `{"notAfter":"2026-12-24T18:00:00Z"}`, `{"notAfter":false}`, `{"notAfter":1,"notAfter":2}`,
	`[1]`, `"s"`, `7`, `null`, `{}`, `{"a":`, `not json`, `{"clientId":"a","body":{"k":"\""}}`,
}

// decodeItem finds what the decoder-based version it replaced found, and refuses what it
// refused with the same answer.
func TestDecodeItemAgreesWithDecoder(t *testing.T) {
	for _, b := range batchItems {
		checkDecodeItem(t, []byte(b))
	}
}

func FuzzDecodeItem(f *testing.F) {
	for _, b := range batchItems {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkDecodeItem(t, b) })
}

func checkDecodeItem(t *testing.T, raw []byte) {
	t.Helper()
	got, gotP := decodeItem(raw)
	want, wantP := decodeItemByDecoder(raw)
	str := func(it batchItem, p *problem) string {
		deref := func(s *string) string {
			if s == nil {
				return "<nil>"
			}
			return *s
		}
		if p != nil {
			return fmt.Sprintf("problem %d %s %s", p.Status, p.Code, p.Detail)
		}
		return fmt.Sprintf("item %q %q %q %q %q", it.ClientID, it.Body, deref(it.IdempotencyKey), deref(it.NotBefore), deref(it.NotAfter))
	}
	if g, w := str(got, gotP), str(want, wantP); g != w {
		t.Errorf("item %q:\n scanner: %s\n decoder: %s", raw, g, w)
	}
}

// decodeItemByDecoder is the earlier decodeItem, which read every field with
// encoding/json's Decoder: the reference the scanner must agree with.
func decodeItemByDecoder(raw json.RawMessage) (batchItem, *problem) {
	var it batchItem
	if !json.Valid(raw) {
		return it, badRequest("malformed_json", "the item is not valid JSON"+whyNotJSON(raw))
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return it, badRequest("item_invalid", `an item is a JSON object: {"clientId": "...", "body": {...}}`)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return it, badRequest("malformed_json", "the item is not valid JSON")
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return it, badRequest("malformed_json", "the item is not valid JSON")
		}
		if seen[key] {
			return it, badRequest("item_invalid", fmt.Sprintf("the item has %q more than once; send it once", truncate(key, 64)))
		}
		seen[key] = true
		var str string
		asString := func(code string) *problem {
			if len(v) == 0 || v[0] != '"' || json.Unmarshal(v, &str) != nil {
				return badRequest(code, fmt.Sprintf("%q must be a JSON string, not %s", key, kindOf(v)))
			}
			if replaced(v, str) {
				return badRequest(code, fmt.Sprintf("%q holds a \\u escape that is not a Unicode character (a lone surrogate)", key))
			}
			return nil
		}
		switch key {
		case "clientId":
			if p := asString("client_id_invalid"); p != nil {
				return it, p
			}
			it.ClientID = str
			if str == "" {
				return it, badRequest("client_id_invalid", request.ValidateClientID("").Error())
			}
		case "body":
			it.Body = v
		case "idempotencyKey":
			if p := asString("idempotency_key_invalid"); p != nil {
				return it, p
			}
			it.IdempotencyKey = &str
		case "notBefore":
			if len(v) > 0 && v[0] != '"' { // a delay in seconds, as a JSON number
				s := string(v)
				it.NotBefore = &s
				continue
			}
			if p := asString("not_before_invalid"); p != nil {
				return it, p
			}
			it.NotBefore = &str
		case "notAfter":
			if len(v) > 0 && v[0] != '"' {
				s := string(v)
				it.NotAfter = &s
				continue
			}
			if p := asString("not_after_invalid"); p != nil {
				return it, p
			}
			it.NotAfter = &str
		default:
			return it, badRequest("item_invalid", fmt.Sprintf("the item has an unknown field %q; an item has clientId, body, idempotencyKey, notBefore and notAfter", truncate(key, 64)))
		}
	}
	return it, nil
}

// A batch sent as a JSON array splits into the same items encoding/json finds, and a
// body that is not one valid array is refused.
func FuzzSplitArray(f *testing.F) {
	f.Add([]byte(`[{"clientId":"a","body":1}, {"clientId":"b","body":[1,"]"]} ,7,"s",null]`))
	f.Add([]byte(" [ ] "))
	f.Add([]byte(`[1,2`))
	f.Add([]byte(`{"a":1}`))
	f.Add([]byte(`[1] [2]`))
	f.Add([]byte(` null`))
	a := &API{cfg: Config{BatchMaxItems: 50}}
	f.Fuzz(func(t *testing.T, body []byte) {
		items, p := a.splitArray(body)
		var want []json.RawMessage
		isArray := len(bytes.TrimLeft(body, " \t\r\n")) > 0 && bytes.TrimLeft(body, " \t\r\n")[0] == '['
		if err := json.Unmarshal(body, &want); err != nil || len(want) > 50 || !isArray {
			if p == nil {
				t.Fatalf("%q: split into %d items, but encoding/json says %v (%d items)", body, len(items), err, len(want))
			}
			return
		}
		if p != nil {
			t.Fatalf("%q: refused (%s), but it is an array of %d items", body, p.Detail, len(want))
		}
		if len(items) != len(want) {
			t.Fatalf("%q: %d items, want %d", body, len(items), len(want))
		}
		for i := range want {
			if !bytes.Equal(items[i], want[i]) {
				t.Fatalf("%q: item %d is %q, want %q", body, i, items[i], want[i])
			}
		}
	})
}
