package ingest

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// maxContentType is the longest Content-Type taken: with the other headers it stays well
// within HeaderRoom.
const maxContentType = 256

// parse reads and checks one POST /v1/requests. It returns the request to publish, or
// the problem to answer with. The body is read into buf (when not nil), which the
// request's Body then shares: the caller keeps buf until it no longer needs the body.
func (a *API) parse(w http.ResponseWriter, r *http.Request, buf *[]byte, scope *Scope) (request.Request, *problem) {
	ct, p := contentType(r.Header)
	if p != nil {
		return request.Request{}, p
	}
	if len(ct) > maxContentType { // stored with the body: it must fit beside it (HeaderRoom)
		return request.Request{}, &problem{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type",
			Detail: fmt.Sprintf("the Content-Type is %d bytes long; at most %d are taken: send Content-Type: application/json", len(ct), maxContentType)}
	}
	if !isJSON(ct) {
		return request.Request{}, &problem{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type",
			Detail: fmt.Sprintf("Content-Type %q is not JSON; send Content-Type: application/json", ct)}
	}
	if p := encoded(r.Header); p != nil {
		return request.Request{}, p
	}
	body, p := a.readBody(w, r, buf)
	if p != nil {
		return request.Request{}, p
	}
	if !validJSON(body) {
		return request.Request{}, badRequest("malformed_json", "the body is not valid JSON"+whyNotJSON(body))
	}

	clientID, p := clientIDOf(r.Header, body)
	if p != nil {
		return request.Request{}, p
	}

	now := time.Now() // one now for the id and both times: Not-Before: 60 with Not-After: 60 is refused, not a request stored to expire
	id := request.NewID(now)
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
		if notBefore, p = a.notBefore(nb[0], now); p != nil {
			return request.Request{}, p
		}
	default:
		return request.Request{}, badRequest("not_before_invalid", "send one Not-Before header, not several")
	}
	var notAfter time.Time
	switch na := r.Header.Values(HeaderNotAfter); len(na) {
	case 0:
	case 1:
		if notAfter, p = notAfterOf(na[0], notBefore, now); p != nil {
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
			got := fmt.Sprintf("%d of the %d bytes its Content-Length announced", len(body), r.ContentLength)
			if r.ContentLength < 0 { // chunked: no length was announced
				got = fmt.Sprintf("%d bytes arrived, and not its end", len(body))
			}
			return nil, &problem{Status: http.StatusRequestTimeout, Code: "body_timeout",
				Detail: fmt.Sprintf("the body did not arrive within %s (%s); nothing was stored", a.cfg.BodyTimeout, got)}
		}
		return nil, &problem{Status: http.StatusBadRequest, Code: "body_unreadable", Detail: "the request body could not be read completely"}
	}
	return body, nil
}

// HeaderNotAfter is the header that gives a request a deadline: an RFC 3339 time, or
// whole seconds from now, after which it is not sent (dead-lettered as expired).
const HeaderNotAfter = "Not-After"

// notAfterOf reads a Not-After value (a header, or a batch item's field as text): an
// RFC 3339 time, or whole seconds from now. It must lie ahead, and after the
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
	case !notBefore.IsZero() && !t.After(notBefore):
		return time.Time{}, badRequest("not_after_invalid", fmt.Sprintf("Not-After %q is not after the request's Not-Before (%s): it could never be sent", v, notBefore.Format(time.RFC3339Nano)))
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
	t, err := request.ParseTime(v)
	return t, err == nil, false
}

func (a *API) notBeforeTooFar(v string) *problem {
	return badRequest("not_before_invalid", fmt.Sprintf("Not-Before %q is further ahead than the limit of %s (MAX_NOT_BEFORE)", truncate(v, 64), a.cfg.MaxNotBefore))
}

// whyNotJSON says where and why b, which is not valid JSON, is not (": invalid character
// '}' ... at byte 17"), as encoding/json finds it; read only for a refusal.
func whyNotJSON(b []byte) string {
	var v json.RawMessage
	err := json.Unmarshal(b, &v)
	var se *json.SyntaxError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &se):
		return fmt.Sprintf(": %s, at byte %d", truncate(se.Error(), 96), se.Offset)
	}
	return ": " + truncate(err.Error(), 96) // nesting too deep, say
}

// clientIDInvalid is the problem of a new request's clientId that ValidateNewClientID
// refused.
func clientIDInvalid(err error) *problem {
	return badRequest("client_id_invalid", err.Error()+"; a clientId is 1 to 128 bytes of UTF-8 text without control characters, and neither starts nor ends with a space")
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

// encoded refuses a body sent with a Content-Encoding (gzip, br, ...): ingest does not
// decode one, and a body stored as it came would reach raven without its encoding
// header, or be refused as not JSON without saying why.
func encoded(h http.Header) *problem {
	ce := h.Values("Content-Encoding")
	if len(ce) == 0 || len(ce) == 1 && strings.EqualFold(strings.TrimSpace(ce[0]), "identity") {
		return nil
	}
	return &problem{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type",
		Detail: fmt.Sprintf("Content-Encoding %q is not taken: send the body unencoded, without a Content-Encoding", truncate(strings.Join(ce, ", "), 64))}
}

func isJSON(ct string) bool {
	if ct == "application/json" { // the usual one, without parsing
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && isJSONType(mt)
}

// isJSONType reports whether media type mt (parsed, lower case) is JSON: application/json
// or a structured syntax suffix of it (application/problem+json, application/vnd.x+json).
func isJSONType(mt string) bool {
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}

// contentType is a POST's Content-Type, or the problem of several: which one the body is
// cannot be guessed (the first was taken before).
func contentType(h http.Header) (string, *problem) {
	switch cts := h.Values("Content-Type"); len(cts) {
	case 0:
		return "", nil
	case 1:
		return cts[0], nil
	default:
		return "", &problem{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type",
			Detail: fmt.Sprintf("%d Content-Type headers (%s): send one", len(cts), truncate(strings.Join(cts, ", "), 64))}
	}
}
