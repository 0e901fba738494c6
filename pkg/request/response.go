package request

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"
)

// Response is raven's answer to one attempt, as the record keeps it (issue 31): its
// status, the headers operators chose to keep (RESPONSE_HEADERS) and its body up to
// RESPONSE_MAX_BYTES. The body is text when it is UTF-8, base64 otherwise
// (BodyEncoding says so); Truncated says the body was cut at the limit (or, for a
// failed attempt's answer, at FailedAnswerBytes).
type Response struct {
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    string            `json:"body,omitempty"`
	// BodyEncoding is "base64" when Body holds bytes that are not UTF-8, base64-encoded
	// (standard, padded); empty when Body is the text itself.
	BodyEncoding string `json:"bodyEncoding,omitempty"`
	// BodyBytes is how many bytes of the body are kept (the decoded size).
	BodyBytes int  `json:"bodyBytes,omitempty"`
	Truncated bool `json:"truncated,omitempty"`
}

// BodyBase64 is Response.BodyEncoding for a body kept as base64.
const BodyBase64 = "base64"

// FailedAnswerBytes bounds the body kept of an attempt that failed and will be retried:
// a request retried many times keeps that many answers, and the last one is what says
// why. A final answer (delivered, or dead-lettered) keeps up to RESPONSE_MAX_BYTES.
const FailedAnswerBytes = 4 << 10

// MaxAnswerBytes is the most RESPONSE_MAX_BYTES may keep: a body kept grows at most
// twofold in its event's JSON (setBody), and the event must fit in one NATS message
// (1 MiB by default).
const MaxAnswerBytes = 256 << 10

// maxHeaderBytes bounds each kept header's value: raven's headers may be long (net/http
// takes up to 1 MiB of them: raven.New sets it), and the event holding them must fit in one NATS message.
const maxHeaderBytes = 1 << 10

// NewResponse is raven's answer with status, the headers of header named in keep, and
// body (already cut to the limit; truncated when it was).
func NewResponse(status int, header http.Header, keep []string, body []byte, truncated bool) *Response {
	r := &Response{Status: status, Truncated: truncated}
	for _, name := range keep {
		if v := header.Values(name); len(v) > 0 {
			if r.Headers == nil {
				r.Headers = make(map[string]string, len(keep))
			}
			joined := strings.Join(v, ", ")
			if len(joined) > maxHeaderBytes {
				joined = strings.Clone(joined[:maxHeaderBytes]) // not the whole value behind it
			}
			joined = strings.ToValidUTF8(joined, "")
			r.Headers[http.CanonicalHeaderKey(name)] = joined
		}
	}
	if truncated {
		body = wholeRunes(body)
	}
	r.setBody(body)
	return r
}

// setBody keeps body as text when it is UTF-8 whose JSON is at most twice its size, and
// as base64 otherwise: JSON writes a control character as six
// bytes (HTML escaping, which would do so for <, > and &, is off in events: Event.JSON),
// so a text body could grow sixfold in the event that carries it, past what one
// NATS message holds; base64 grows by a third, whatever the body. (Twice, not a third:
// JSON's quotes double, and a JSON answer is text a reader wants to see as text.)
func (r *Response) setBody(body []byte) {
	r.BodyBytes = len(body)
	if utf8.Valid(body) && jsonTextBytes(body) <= 2*len(body) {
		r.Body, r.BodyEncoding = string(body), ""
		return
	}
	r.Body, r.BodyEncoding = base64.StdEncoding.EncodeToString(body), BodyBase64
}

// jsonTextBytes is how many bytes encoding/json writes for b as a string's contents
// (UTF-8 assumed) with HTML escaping off, as Event.JSON writes it.
func jsonTextBytes(b []byte) int {
	n := len(b)
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t':
			n++
		case c < 0x20:
			n += 5
		case c == 0xe2 && i+2 < len(b) && b[i+1] == 0x80 && (b[i+2] == 0xa8 || b[i+2] == 0xa9):
			n += 3 // U+2028, U+2029: three bytes written as six
		}
	}
	return n
}

// Fit is e with raven's answer cut so that its JSON (Event.JSON) is at most limit bytes:
// the body cut first, then the headers left out. An event must fit in one NATS message
// whatever raven answered and whatever the server's max_payload; the answer is what
// gives way. e as it is when it fits, or has no answer.
func (e Event) Fit(limit int) Event {
	if e.Response == nil || e.Response.jsonBound() <= limit {
		return e // fits without encoding it to see (the common case, on the send path)
	}
	for over := len(e.JSON()) - limit; over > 0; over = len(e.JSON()) - limit {
		r := e.Response
		switch {
		case r.BodyBytes > 0:
			// Each byte of the body is at least one byte of the JSON.
			e.Response = r.Cut(max(0, r.BodyBytes-over))
		case len(r.Headers) > 0:
			c := *r
			c.Headers, c.Truncated = nil, true
			e.Response = &c
		default:
			return e // only the status is left: the event is as small as it gets
		}
	}
	return e
}

// jsonBound is more than an event carrying r can take in JSON: a kept body is at most
// twice its size there (setBody), a header value at most six times, and the event's
// other fields (ids, times, an error's few words) well under eventRest.
func (r *Response) jsonBound() int {
	n := 2*len(r.Body) + eventRest
	for k, v := range r.Headers {
		n += 6 * (len(k) + len(v))
	}
	return n
}

// eventRest bounds an event's JSON without raven's answer.
const eventRest = 4 << 10

// Bytes is the kept body as raven sent it (decoded when it is base64).
func (r *Response) Bytes() ([]byte, error) {
	if r.BodyEncoding != BodyBase64 {
		return []byte(r.Body), nil
	}
	b, err := base64.StdEncoding.DecodeString(r.Body)
	if err != nil {
		return nil, fmt.Errorf("the kept body is not base64: %w", err)
	}
	return b, nil
}

// Cut is r with its body cut to at most n bytes (a copy; r itself when it is short
// enough, or nil). Text cut in the middle of a character is cut before it.
func (r *Response) Cut(n int) *Response {
	if r == nil || r.BodyBytes <= n {
		return r
	}
	b, err := r.Bytes()
	if err != nil {
		return r
	}
	b = b[:n]
	if r.BodyEncoding == "" {
		b = wholeRunes(b)
	}
	c := *r
	c.setBody(b)
	c.Truncated = true
	return &c
}

// wholeRunes is text b cut in the middle of a character cut before that character
// instead: still text. b as it is otherwise (text already, or bytes that are not text).
func wholeRunes(b []byte) []byte {
	if utf8.Valid(b) {
		return b
	}
	for i := len(b) - 1; i >= 0 && i >= len(b)-(utf8.UTFMax-1); i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) && utf8.Valid(b[:i]) {
				return b[:i]
			}
			break
		}
	}
	return b
}
