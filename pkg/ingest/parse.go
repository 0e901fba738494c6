package ingest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// maxContentType is the longest Content-Type taken: with the other headers it stays well
// within HeaderRoom.
const maxContentType = 256

// parse reads and checks one POST /v1/requests. It returns the request to publish, or
// the problem to answer with. The body is read into buf (when not nil), which the
// request's Body then shares: the caller keeps buf until it no longer needs the body.
func (a *API) parse(w http.ResponseWriter, r *http.Request, buf *[]byte, scope *Scope) (request.Request, *problem) {
	ct := r.Header.Get("Content-Type")
	if len(ct) > maxContentType { // stored with the body: it must fit beside it (HeaderRoom)
		return request.Request{}, &problem{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type",
			Detail: fmt.Sprintf("the Content-Type is %d bytes long; at most %d are taken: send Content-Type: application/json", len(ct), maxContentType)}
	}
	if !isJSON(ct) {
		return request.Request{}, &problem{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type",
			Detail: fmt.Sprintf("Content-Type %q is not JSON; send Content-Type: application/json", ct)}
	}
	body, p := a.readBody(w, r, buf)
	if p != nil {
		return request.Request{}, p
	}
	if !validJSON(body) {
		return request.Request{}, badRequest("malformed_json", "the body is not valid JSON")
	}

	clientID, p := clientIDOf(r.Header, body)
	if p != nil {
		return request.Request{}, p
	}
	if err := request.ValidateClientID(clientID); err != nil {
		return request.Request{}, badRequest("client_id_invalid", err.Error()+"; a clientId is 1 to 128 bytes of UTF-8 text without control characters")
	}

	id := request.NewID(time.Now())
	switch keys := r.Header.Values(request.HeaderIdempotencyKey); len(keys) {
	case 0:
	case 1:
		if err := request.ValidateIdempotencyKey(keys[0]); err != nil {
			return request.Request{}, badRequest("idempotency_key_invalid", err.Error())
		}
		id = scope.idFromKey(clientID, keys[0])
	default:
		return request.Request{}, badRequest("idempotency_key_invalid", "send one Idempotency-Key header, not several")
	}
	var notBefore time.Time
	switch nb := r.Header.Values(HeaderNotBefore); len(nb) {
	case 0:
	case 1:
		if notBefore, p = a.notBefore(nb[0], time.Now()); p != nil {
			return request.Request{}, p
		}
	default:
		return request.Request{}, badRequest("not_before_invalid", "send one Not-Before header, not several")
	}
	var notAfter time.Time
	switch na := r.Header.Values(HeaderNotAfter); len(na) {
	case 0:
	case 1:
		if notAfter, p = notAfterOf(na[0], notBefore, time.Now()); p != nil {
			return request.Request{}, p
		}
	default:
		return request.Request{}, badRequest("not_after_invalid", "send one Not-After header, not several")
	}
	return request.Request{ID: id, ClientID: clientID, ContentType: ct, Body: body, NotBefore: notBefore, NotAfter: notAfter,
		BodyDigest: request.BodyDigestOf(id, body)}, nil
}

// readBody reads the request's body, at most MaxBodyBytes, within BodyTimeout, into buf
// when given (a pooled buffer: *buf is the body read, to be put back).
func (a *API) readBody(w http.ResponseWriter, r *http.Request, buf *[]byte) ([]byte, *problem) {
	if r.ContentLength > a.cfg.MaxBodyBytes {
		return nil, tooLarge(a.cfg.MaxBodyBytes)
	}
	// The body gets a deadline of its own: the server's read timeout is for the whole
	// request, and a caller that promised more bytes than it sends would hold the
	// connection that long. (Not every ResponseWriter can set one; tests' recorders
	// cannot, and need not.)
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(a.cfg.BodyTimeout))
	var dst []byte
	if buf != nil {
		dst = (*buf)[:0]
		// Known and at most MaxBodyBytes: one allocation. Only up to maxPooled before a
		// byte arrived: a caller announcing a large body and sending nothing must not
		// pin it.
		if r.ContentLength > int64(cap(dst)) {
			dst = make([]byte, 0, min(r.ContentLength+1, maxPooled))
		}
	}
	body, err := readInto(dst, http.MaxBytesReader(w, r.Body, a.cfg.MaxBodyBytes))
	if buf != nil {
		*buf = body
	}
	if err != nil {
		var mbe *http.MaxBytesError
		var ne net.Error
		switch {
		case errors.As(err, &mbe):
			return nil, tooLarge(a.cfg.MaxBodyBytes)
		case errors.As(err, &ne) && ne.Timeout():
			return nil, &problem{Status: http.StatusRequestTimeout, Code: "body_timeout",
				Detail: fmt.Sprintf("the body did not arrive within %s (%d of the %d bytes its Content-Length announced); nothing was stored", a.cfg.BodyTimeout, len(body), r.ContentLength)}
		}
		return nil, &problem{Status: http.StatusBadRequest, Code: "body_unreadable", Detail: "the request body could not be read completely"}
	}
	return body, nil
}

// HeaderNotAfter is the header that gives a request a deadline: an RFC 3339 time, or
// whole seconds from now, after which it is not sent (dead-lettered as expired).
const HeaderNotAfter = "Not-After"

// notAfterOf reads a Not-After value (a header, or a batch item's field as text): an
// RFC 3339 time, or whole seconds from now. It must lie ahead, and not before the
// request's Not-Before (zero when it has none): a request that may never be sent is
// refused rather than stored to expire.
func notAfterOf(v string, notBefore, now time.Time) (time.Time, *problem) {
	t, ok, tooFar := timeOf(v, now, maxNotAfter)
	v = truncate(strings.TrimSpace(v), 64)
	switch {
	case tooFar:
		return time.Time{}, badRequest("not_after_invalid", fmt.Sprintf("Not-After %q is too far ahead: give an RFC 3339 time or a number of seconds up to %d", v, int64(maxNotAfter/time.Second)))
	case !ok:
		return time.Time{}, badRequest("not_after_invalid", fmt.Sprintf("Not-After %q is neither an RFC 3339 time (2026-12-24T18:00:00Z) nor whole seconds from now (300)", v))
	case !t.After(now):
		return time.Time{}, badRequest("not_after_invalid", fmt.Sprintf("Not-After %q is not ahead: a request whose deadline has passed would never be sent; give a later time, or none", v))
	case !notBefore.IsZero() && t.Before(notBefore):
		return time.Time{}, badRequest("not_after_invalid", fmt.Sprintf("Not-After %q is before the request's Not-Before (%s): it could never be sent", v, notBefore.Format(time.RFC3339)))
	}
	return t.UTC(), nil
}

// maxNotAfter bounds a Not-After given in seconds, so that the sum stays a time.
const maxNotAfter = 100 * 365 * 24 * time.Hour

// HeaderNotBefore is the header that delays a request: an RFC 3339 time, or a delay in
// whole seconds.
const HeaderNotBefore = "Not-Before"

// notBefore reads a Not-Before value (a header, or a batch item's field as text): an
// RFC 3339 time, or a delay in whole seconds from now. A time already past is no delay
// (zero); one beyond MaxNotBefore is refused.
func (a *API) notBefore(v string, now time.Time) (time.Time, *problem) {
	t, ok, tooFar := timeOf(v, now, a.cfg.MaxNotBefore)
	switch {
	case tooFar || ok && t.After(now.Add(a.cfg.MaxNotBefore)):
		return time.Time{}, a.notBeforeTooFar(strings.TrimSpace(v))
	case !ok:
		return time.Time{}, badRequest("not_before_invalid", fmt.Sprintf("Not-Before %q is neither an RFC 3339 time (2026-12-24T18:00:00Z) nor a delay in whole seconds (90)", truncate(strings.TrimSpace(v), 64)))
	case !t.After(now):
		return time.Time{}, nil
	}
	return t.UTC(), nil
}

// timeOf reads a time given as an RFC 3339 time or as whole seconds from now (the
// Not-Before and Not-After headers and batch fields). tooFar: seconds beyond limit (a
// time given as such is the caller's to bound); ok false: neither form.
func timeOf(v string, now time.Time, limit time.Duration) (t time.Time, ok, tooFar bool) {
	v = strings.TrimSpace(v)
	if v != "" && strings.Trim(v, "0123456789") == "" {
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil || time.Duration(secs) > limit/time.Second {
			return time.Time{}, false, true
		}
		return now.Add(time.Duration(secs) * time.Second), true, false
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	return t, err == nil, false
}

func (a *API) notBeforeTooFar(v string) *problem {
	return badRequest("not_before_invalid", fmt.Sprintf("Not-Before %q is further ahead than the limit of %s (MAX_NOT_BEFORE)", truncate(v, 64), a.cfg.MaxNotBefore))
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

func tooLarge(limit int64) *problem {
	return &problem{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large",
		Detail: fmt.Sprintf("the body is larger than the limit of %d bytes", limit)}
}

func badRequest(code, detail string) *problem {
	return &problem{Status: http.StatusBadRequest, Code: code, Detail: detail}
}

func isJSON(ct string) bool {
	if ct == "application/json" { // the usual one, without parsing
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")))
}

// clientIDOf takes the clientId from the X-Client-Id header when there is one, else from
// the body's top-level string field "clientId". When both are there they must agree: a
// raven that reads the body's would otherwise see requests of one client spaced as
// another's. It does not validate the id itself.
func clientIDOf(h http.Header, body []byte) (string, *problem) {
	switch vs := h.Values(request.HeaderClientID); len(vs) {
	case 0:
	case 1:
		if inBody, err := clientIDFromBody(body); err == nil && inBody != vs[0] {
			return "", badRequest("client_id_mismatch", fmt.Sprintf("the X-Client-Id header says %q and the body's \"clientId\" says %q: send one, or the same in both", vs[0], inBody))
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
	return id, nil
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
		if !isClientIDKey(key) {
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
// written plainly or with escapes.
func isClientIDKey(key []byte) bool {
	if string(key) == `"clientId"` {
		return true
	}
	if len(key) < len(`"clientId"`) || bytes.IndexByte(key, '\\') < 0 {
		return false
	}
	k, ok := jsonString(key)
	return ok && k == "clientId"
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
