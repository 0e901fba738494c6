// Package openapitest holds HTTP exchanges in tests to an OpenAPI 3.1 document (those of
// package openapi): a Checker validates each request and the real answer to it with
// libopenapi-validator, and fails the test listing every difference. Wrap a test's
// http.Client transport with Checker.Transport, or hand exchanges to Checker.Response.
package openapitest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"
	"github.com/pb33f/libopenapi-validator/content"
	verrors "github.com/pb33f/libopenapi-validator/errors"
	"github.com/pb33f/libopenapi-validator/helpers"
)

// Checker validates HTTP exchanges against one OpenAPI document. It is safe for
// concurrent use.
//
// What it holds an exchange to:
//   - The answer always: its status code must be documented for the operation, its
//     declared headers present and well formed, its body of a documented media type and
//     valid against the schema (formats such as date-time included).
//   - The request (path and query parameters, headers, body) when the server accepted
//     it (a status below 400): a server that takes what the document refuses, or a
//     document that refuses what the server takes, is a difference. A request answered
//     4xx or 5xx may be wrong on purpose, so it is not checked.
//     An operation marked "x-partial-success": "<field>" (a batch, whose 200 answer
//     refuses items one by one) has its request body checked only when the answer's
//     top-level <field> is 0: the items it refused may be wrong on purpose.
//   - A request to a path or method the document does not have is a difference, unless
//     the server refused it with 404 or 405 (a test of the router's refusals).
//
// Bearer tokens are not checked against the security schemes: whether a token is
// needed depends on the deployment, and a 401 answer is checked like any other.
type Checker struct {
	mu     sync.Mutex // the validator's caches are not documented as safe for concurrent use
	v      validator.Validator
	routes []route
}

type route struct {
	method   string
	segments []string // "{id}" matches any one segment
	// partial names the answer's field that counts the parts of the request refused
	// (x-partial-success); empty for an operation that succeeds or fails whole.
	partial string
}

// NewChecker returns a Checker for doc (an OpenAPI 3.1 document, JSON or YAML). It fails
// tb at once if doc cannot be read as one.
func NewChecker(tb testing.TB, doc []byte) *Checker {
	tb.Helper()
	d, err := libopenapi.NewDocument(doc)
	if err != nil {
		tb.Fatalf("openapitest: reading the document: %v", err)
	}
	v, errs := validator.NewValidator(d,
		config.WithoutSecurityValidation(),
		config.WithFormatAssertions(),
		config.WithBodyDecoder("application/x-ndjson", ndjson()),
	)
	if len(errs) > 0 {
		tb.Fatalf("openapitest: building the validator: %v", errs)
	}
	c := &Checker{v: v}
	for _, op := range operations(tb, doc) {
		c.routes = append(c.routes, route{method: op.method, segments: strings.Split(op.path, "/"), partial: op.partial})
	}
	return c
}

// Response validates one exchange: req as sent with reqBody (nil for none), and resp as
// received with respBody, the bodies being what was read from them (req.Body and
// resp.Body are not read). It reports every difference with tb.Errorf, so it may be
// called from any goroutine.
func (c *Checker) Response(tb testing.TB, req *http.Request, reqBody []byte, resp *http.Response, respBody []byte) {
	tb.Helper()
	if errs := c.check(req, reqBody, resp, respBody); len(errs) > 0 {
		tb.Errorf("openapitest: %s %s answered %d: %d difference(s) from the document:\n\t%s",
			req.Method, req.URL.RequestURI(), resp.StatusCode, len(errs), strings.Join(errs, "\n\t"))
	}
}

// Transport returns a RoundTripper that sends each request with base
// (http.DefaultTransport when nil) and validates every exchange as Response does. It
// reads each request and response body whole, and hands the caller the response with
// its body restored; an exchange that fails in transport is not validated.
func (c *Checker) Transport(tb testing.TB, base http.RoundTripper) http.RoundTripper {
	tb.Helper()
	if base == nil {
		base = http.DefaultTransport
	}
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		var reqBody []byte
		out := req
		if req.Body != nil && req.Body != http.NoBody {
			var err error
			reqBody, err = io.ReadAll(req.Body)
			req.Body.Close()
			if err != nil {
				return nil, fmt.Errorf("openapitest: reading the request body: %w", err)
			}
			out = req.Clone(req.Context())
			out.Body = io.NopCloser(bytes.NewReader(reqBody))
			out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(reqBody)), nil }
		}
		resp, err := base.RoundTrip(out)
		if err != nil {
			return resp, err
		}
		respBody, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(respBody))
		if err != nil {
			return resp, fmt.Errorf("openapitest: reading the response body: %w", err)
		}
		c.Response(tb, out, reqBody, resp, respBody)
		return resp, nil
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// check returns every difference between the exchange and the document.
func (c *Checker) check(req *http.Request, reqBody []byte, resp *http.Response, respBody []byte) []string {
	rt, ok := c.route(req.Method, req.URL.Path)
	if !ok {
		if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed {
			return nil
		}
		return []string{fmt.Sprintf("the document has no operation %s %s", req.Method, req.URL.Path)}
	}
	// The validator reads the bodies: it gets copies, and the caller's are left alone.
	r := req.Clone(req.Context())
	r.Body = io.NopCloser(bytes.NewReader(reqBody))
	r.ContentLength = int64(len(reqBody))
	w := *resp
	w.Body = io.NopCloser(bytes.NewReader(respBody))
	w.ContentLength = int64(len(respBody))
	w.Request = r

	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []*verrors.ValidationError
	if resp.StatusCode < 400 {
		_, reqErrs := c.v.ValidateHttpRequestSync(r)
		bodyChecked := rt.partial == "" || refused(respBody, rt.partial) == 0
		for _, e := range reqErrs {
			if e.ValidationType == helpers.RequestBodyValidation && !bodyChecked {
				continue
			}
			e.Message = "request: " + e.Message
			errs = append(errs, e)
		}
	}
	_, respErrs := c.v.ValidateHttpResponse(r, &w)
	for _, e := range respErrs {
		e.Message = "response: " + e.Message
	}
	return describe(append(errs, respErrs...))
}

// route returns the document's operation for method and path.
func (c *Checker) route(method, path string) (route, bool) {
	segs := strings.Split(path, "/")
	for _, r := range c.routes {
		if r.method == method && len(r.segments) == len(segs) && slices.EqualFunc(r.segments, segs, func(t, s string) bool {
			return t == s || strings.HasPrefix(t, "{") && strings.HasSuffix(t, "}") && s != ""
		}) {
			return r, true
		}
	}
	return route{}, false
}

// refused reads the count of refused parts from the answer's top-level field; 0 when it
// cannot be read, so that the request body is checked then.
func refused(body []byte, field string) float64 {
	var m map[string]any
	if json.Unmarshal(body, &m) != nil {
		return 0
	}
	if n, ok := m[field].(float64); ok {
		return n
	}
	return 0
}

// describe turns validation errors into lines a person can act on.
func describe(errs []*verrors.ValidationError) []string {
	var out []string
	for _, e := range errs {
		line := e.Message
		if e.Reason != "" && e.Reason != e.Message {
			line += ": " + e.Reason
		}
		for _, f := range e.SchemaValidationErrors {
			where := f.FieldPath
			if where == "" {
				where = "/" + strings.Join(f.InstancePath, "/")
			}
			line += fmt.Sprintf("\n\t\t%s: %s", where, f.Reason)
		}
		if e.SpecLine > 0 {
			line += fmt.Sprintf(" (document line %d)", e.SpecLine)
		}
		out = append(out, line)
	}
	return out
}

// ndjson decodes an application/x-ndjson body into the array of its lines' values, for
// the schema of such a body: an array whose items are the lines.
func ndjson() content.Decoder {
	return content.DecoderFunc(func(in *content.DecodeInput) (any, error) {
		items := []any{}
		if in == nil || in.Body == nil {
			return items, nil
		}
		sc := bufio.NewScanner(in.Body)
		sc.Buffer(nil, 64<<20)
		for n := 1; sc.Scan(); n++ {
			line := bytes.TrimSpace(sc.Bytes())
			if len(line) == 0 {
				continue
			}
			var v any
			if err := json.Unmarshal(line, &v); err != nil {
				return nil, fmt.Errorf("NDJSON line %d: %w", n, err)
			}
			items = append(items, v)
		}
		return items, sc.Err()
	})
}

// Routes returns every operation of doc as "METHOD /path/{param}", sorted. It fails tb
// at once if doc cannot be read as an OpenAPI 3 document.
func Routes(tb testing.TB, doc []byte) []string {
	tb.Helper()
	var out []string
	for _, op := range operations(tb, doc) {
		out = append(out, op.method+" "+op.path)
	}
	slices.Sort(out)
	return out
}

type operation struct {
	method, path, partial string
}

// operations lists doc's operations.
func operations(tb testing.TB, doc []byte) []operation {
	tb.Helper()
	d, err := libopenapi.NewDocument(doc)
	if err != nil {
		tb.Fatalf("openapitest: reading the document: %v", err)
	}
	m, err := d.BuildV3Model()
	if err != nil {
		tb.Fatalf("openapitest: building the document's model: %v", err)
	}
	var out []operation
	if m.Model.Paths == nil {
		return out
	}
	for path, item := range m.Model.Paths.PathItems.FromOldest() {
		for method, op := range item.GetOperations().FromOldest() {
			o := operation{method: strings.ToUpper(method), path: path}
			if op.Extensions == nil {
				out = append(out, o)
				continue
			}
			if x, ok := op.Extensions.Get("x-partial-success"); ok && x != nil {
				o.partial = x.Value
			}
			out = append(out, o)
		}
	}
	return out
}
