package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Errors a call returns, without asking ingest, for arguments ingest would refuse.
var (
	// ErrClientIDMissing is a submit, or a status question, without a clientId.
	ErrClientIDMissing = errors.New("the clientId is empty")
	// ErrBodyNotJSON is a submit whose body is not one JSON value.
	ErrBodyNotJSON = errors.New("the body is not valid JSON")
	// ErrIDMissing is a status question without a request id.
	ErrIDMissing = errors.New("the request id is empty")
)

// ErrNoSuchRequest is Wait's error when ingest answered StatusUnknown: it holds no
// request of that id for that clientId. Either the clientId or the id is not the
// Receipt's (clientIds are case-sensitive: "Olga" is not "olga"), or the request is
// older than ingest's status retention.
var ErrNoSuchRequest = errors.New("ingest holds no such request")

// Problem is an answer in which ingest (or a proxy in front of it) refused a request:
// an RFC 9457 problem detail, or any other non-2xx answer. Find it with errors.As.
type Problem struct {
	// Status is the HTTP status code, such as 429.
	Status int
	// Code names the kind of problem, such as "backlog_full"; it is empty when the
	// answer was not a problem detail (say, a proxy's text/plain 502).
	Code string
	// Title is the problem's short summary, or the status text.
	Title string
	// Detail says what happened and what to do about it; for an answer that was not a
	// problem detail it holds the answer's first bytes.
	Detail string
	// RetryAfter is how long ingest asked to wait before trying again, zero when it did
	// not ask.
	RetryAfter time.Duration
}

// Error says the status, code and detail.
func (p *Problem) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "ingest answered %d", p.Status)
	switch {
	case p.Code != "":
		b.WriteString(" " + p.Code)
	case p.Title != "":
		b.WriteString(" " + p.Title)
	}
	if p.Detail != "" {
		b.WriteString(": " + p.Detail)
	}
	return b.String()
}

// retryable reports whether the same request may succeed later: ingest's 429 and 503
// say so, and a proxy's 502 and 504 say ingest was not reached or did not answer in
// time. (With an Idempotency-Key, resending after a 504 is safe even if ingest
// stored the request.) Nothing else is retried: 400, 401, 403, 404, 413 and 415 need a
// different request; 408 body_timeout means the body did not arrive within ingest's
// read timeout, and the same body over the same path would hold a server connection
// to fail the same way; ingest never answers 500 by design, so a 500 is a bug that
// retrying hides rather than fixes.
func (p *Problem) retryable() bool {
	switch p.Status {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// wireProblem is a problem detail as JSON, in an answer's body or in a batch result.
type wireProblem struct {
	Title  string `json:"title"`
	Status int    `json:"status"`
	Code   string `json:"code"`
	Detail string `json:"detail"`
	// RetryAfter is in whole seconds; only batch results carry it in the body.
	RetryAfter int `json:"retryAfter"`
}

// problem turns a batch result's problem into a *Problem.
func (w wireProblem) problem() *Problem {
	p := &Problem{Status: w.Status, Code: w.Code, Title: w.Title, Detail: w.Detail,
		RetryAfter: time.Duration(min(max(w.RetryAfter, 0), int(maxRetryAfter/time.Second))) * time.Second}
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	return p
}

// maxDetailBytes is how much of a non-problem answer becomes a Problem's Detail.
const maxDetailBytes = 256

// problemFromAnswer turns a non-2xx answer into a *Problem: the problem detail when
// the body is one, else the status and the body's first bytes.
func problemFromAnswer(resp *http.Response, body []byte) *Problem {
	p := &Problem{
		Status:     resp.StatusCode,
		Title:      http.StatusText(resp.StatusCode),
		RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()),
	}
	mediaType, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mediaType == "application/problem+json" || mediaType == "application/json" {
		var w wireProblem
		if json.Unmarshal(body, &w) == nil && (w.Code != "" || w.Title != "" || w.Detail != "") {
			p.Code, p.Detail = w.Code, w.Detail
			if w.Title != "" {
				p.Title = w.Title
			}
			return p
		}
	}
	p.Detail = excerpt(body)
	return p
}

// excerpt is the start of body as one trimmed line of valid UTF-8.
func excerpt(body []byte) string {
	if len(body) > maxDetailBytes {
		body = body[:maxDetailBytes]
		for len(body) > 0 && !utf8.Valid(body) {
			body = body[:len(body)-1]
		}
	}
	return strings.Join(strings.Fields(strings.ToValidUTF8(string(body), "?")), " ")
}

// maxRetryAfter caps a Retry-After, so that a garbled header cannot overflow a
// duration; the caller's context bounds the wait anyway.
const maxRetryAfter = 24 * time.Hour

// parseRetryAfter reads a Retry-After header: whole seconds, or an HTTP date. Anything
// else, or a time in the past, is zero.
func parseRetryAfter(value string, now time.Time) time.Duration {
	value = strings.TrimSpace(value)
	if value == "" {
		return 0
	}
	if seconds, err := strconv.ParseInt(value, 10, 64); err == nil {
		return time.Duration(min(max(seconds, 0), int64(maxRetryAfter/time.Second))) * time.Second
	}
	if at, err := http.ParseTime(value); err == nil {
		return min(max(at.Sub(now), 0), maxRetryAfter)
	}
	return 0
}
