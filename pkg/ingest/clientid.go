package ingest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Where a request names its client: the X-Client-Id header, the body's top-level
// "clientId", and what must agree between them.

// clientIDOf takes the clientId from the X-Client-Id header when there is one, else from
// the body's top-level string field "clientId". When both are there they must agree: a
// raven that reads the body's would otherwise see requests of one client spaced as
// another's. The id it returns is valid for a new request (ValidateNewClientID).
func clientIDOf(h http.Header, body []byte) (string, *problem) {
	switch vs := h.Values(request.HeaderClientID); len(vs) {
	case 0:
	case 1:
		if err := request.ValidateNewClientID(vs[0]); err != nil {
			return "", clientIDInvalid(err)
		}
		if p := sameClient(vs[0], body, "the X-Client-Id header"); p != nil {
			return "", p
		}
		return vs[0], nil
	default:
		return "", badRequest("client_id_invalid", "send one X-Client-Id header, not several")
	}
	id, err := clientIDFromBody(body)
	switch {
	case errors.Is(err, errNoClientID):
		return "", badRequest("client_id_missing", err.Error())
	case err != nil:
		return "", badRequest("client_id_invalid", err.Error())
	}
	if err := request.ValidateNewClientID(id); err != nil {
		return "", clientIDInvalid(err)
	}
	return id, nil
}

// sameClient checks that body, when it is a JSON object holding a top-level "clientId",
// names the client id that where (the header, a batch item's field) names, and holds it
// plainly: one key, a string, spelled exactly so. A raven that reads the body's clientId
// would otherwise see one client's requests spaced as another's.
func sameClient(id string, body []byte, where string) *problem {
	inBody, err := clientIDFromBody(body)
	switch {
	case errors.Is(err, errNoClientID):
		return nil
	case err != nil:
		return badRequest("client_id_invalid", "the body's clientId: "+err.Error())
	case inBody != id:
		return badRequest("client_id_mismatch", fmt.Sprintf("%s says %q and the body's \"clientId\" says %q: send one, or the same in both", where, truncate(id, 64), truncate(inBody, 64)))
	}
	return nil
}

var errNoClientID = errors.New(`no clientId: send an X-Client-Id header, or a JSON object body with a top-level string field "clientId"`)

// clientIDFromBody finds the top-level "clientId" of a JSON object that is already known
// to be valid JSON (json.Valid). A second "clientId" key is refused rather than guessed
// at. It scans the top level once, skipping the other values without decoding them, and
// decodes only a key or a clientId that holds an escape: a typical body costs no
// allocation but the clientId string.
func clientIDFromBody(body []byte) (string, error) {
	if i := skipSpace(body, 0); i == len(body) || body[i] != '{' {
		return "", errNoClientID
	}
	var id string
	found := false
	for key, raw := range members(body) {
		switch exact, folded := isClientIDKey(key); {
		case folded && !exact:
			k, _ := jsonString(key)
			return "", fmt.Errorf(`the body has the key %q, which JSON readers that ignore case (Go's among them) take for "clientId": spell it "clientId", or rename it`, truncate(k, 64))
		case !exact:
			continue
		}
		if found {
			return "", errors.New(`the body has "clientId" more than once; send it once`)
		}
		found = true
		var err error
		if id, err = clientIDValue(raw); err != nil {
			return "", err
		}
	}
	if !found {
		return "", errNoClientID
	}
	return id, nil
}

// members yields the keys (as raw JSON strings, quotes included) and raw values of the
// JSON object obj, which must be valid JSON (json.Valid) and an object.
func members(obj []byte) iter.Seq2[[]byte, []byte] {
	return func(yield func(key, value []byte) bool) {
		i := skipSpace(obj, 0) // at '{'
		for i = skipSpace(obj, i+1); i < len(obj) && obj[i] != '}'; i = skipSpace(obj, i) {
			if obj[i] == ',' {
				i = skipSpace(obj, i+1)
			}
			keyEnd := stringEnd(obj, i)
			key := obj[i:keyEnd]
			i = skipSpace(obj, keyEnd) // at ':'
			i = skipSpace(obj, i+1)    // at the value
			end := skipValue(obj, i)
			if !yield(key, obj[i:end:end]) {
				return
			}
			i = end
		}
	}
}

// isClientIDKey says whether the JSON string key (quotes included) is "clientId",
// written plainly or with escapes (exact), or is so but for the case of its letters
// (folded), as a JSON reader that ignores case reads keys: Go's encoding/json takes the
// last of such keys for a field tagged "clientId".
func isClientIDKey(key []byte) (exact, folded bool) {
	if string(key) == `"clientId"` {
		return true, true
	}
	if len(key) < len(`"clientId"`) {
		return false, false
	}
	if bytes.IndexByte(key, '\\') < 0 {
		return false, len(key) == len(`"clientId"`) && bytes.EqualFold(key, []byte(`"clientId"`))
	}
	k, ok := jsonString(key)
	return ok && k == "clientId", ok && strings.EqualFold(k, "clientId")
}

// jsonString decodes the raw JSON string s (quotes included); valid UTF-8 without
// escapes is taken as it stands.
func jsonString(s []byte) (string, bool) {
	if bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s) {
		return string(s[1 : len(s)-1]), true
	}
	var out string
	return out, json.Unmarshal(s, &out) == nil
}

// clientIDValue decodes the JSON value raw of a "clientId" key, which must be a string.
func clientIDValue(raw []byte) (string, error) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", fmt.Errorf(`"clientId" must be a JSON string, not %s`, kindOf(raw))
	}
	if !utf8.Valid(raw) {
		return "", request.ErrClientIDInvalidUTF8
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1 : len(raw)-1]), nil
	}
	var id string
	if err := json.Unmarshal(raw, &id); err != nil {
		return "", errNoClientID
	}
	if replaced(raw, id) {
		return "", errors.New(`"clientId" holds a \u escape that is not a Unicode character (a lone surrogate)`)
	}
	return id, nil
}

// skipSpace returns the index of the first byte at or after i that is not JSON white
// space.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index just past the JSON string that starts at b[i] (a quote).
// b is valid JSON, so the string is closed.
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		for j < len(b) && plain[b[j]] {
			j++
		}
		if j == len(b) {
			break
		}
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(b)
}

// skipValue returns the index just past the JSON value that starts at b[i]. b is valid
// JSON.
func skipValue(b []byte, i int) int {
	if i == len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				j = stringEnd(b, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return len(b)
	default: // a number, true, false or null
		for j := i; j < len(b); j++ {
			switch b[j] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return j
			}
		}
		return len(b)
	}
}

// replaced says whether decoding the JSON string raw into s put in a U+FFFD replacement
// character that raw did not hold: the decoder replaces a lone surrogate escape, which
// would make distinct strings one clientId.
func replaced(raw json.RawMessage, s string) bool {
	n := strings.Count(s, "\uFFFD")
	if n == 0 {
		return false
	}
	lower := bytes.ToLower(raw)
	return n > bytes.Count(raw, []byte("\uFFFD"))+bytes.Count(lower, []byte(`\ufffd`))
}

func kindOf(raw json.RawMessage) string {
	switch {
	case len(raw) == 0:
		return "empty"
	case raw[0] == '{':
		return "an object"
	case raw[0] == '[':
		return "an array"
	case bytes.Equal(raw, []byte("null")):
		return "null"
	case bytes.Equal(raw, []byte("true")), bytes.Equal(raw, []byte("false")):
		return "a boolean"
	default:
		return "a number"
	}
}
