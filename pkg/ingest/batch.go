package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/tracing"
)

// batchItem is one item of a batch, read from its JSON object. An item maps to a single
// POST /v1/requests exactly: clientId is its X-Client-Id header, body the bytes of its
// body (as they stand in the batch, byte for byte) with Content-Type application/json,
// idempotencyKey its Idempotency-Key header, notBefore its Not-Before header.
type batchItem struct {
	ClientID       string
	Body           json.RawMessage
	IdempotencyKey *string
	NotBefore      *string
	NotAfter       *string
}

// batchResult is one item's result: queued with its id, or failed with its problem.
type batchResult struct {
	Index     int           `json:"index"`
	Status    string        `json:"status"` // queued or failed
	ID        string        `json:"id,omitempty"`
	ClientID  string        `json:"clientId,omitempty"`
	Duplicate bool          `json:"duplicate,omitempty"`
	NotBefore time.Time     `json:"notBefore,omitzero"`
	Problem   *itemProblem  `json:"problem,omitempty"`
	retry     time.Duration // the item's Retry-After
}

type itemProblem struct {
	Status     int    `json:"status"`
	Code       string `json:"code"`
	Detail     string `json:"detail"`
	RetryAfter int    `json:"retryAfter,omitempty"` // seconds
}

type batchAnswer struct {
	Results  []batchResult `json:"results"`
	Accepted int           `json:"accepted"`
	Failed   int           `json:"failed"`
}

const ndjson = "application/x-ndjson"

// acceptBatch takes many requests in one call: every valid item is published at once,
// the answer waits for all the acknowledgements and gives each item's result in order.
func (a *API) acceptBatch(w http.ResponseWriter, r *http.Request, scope *Scope) {
	mt, p := a.batchType(r)
	if p != nil {
		a.cfg.Metrics.outcome(p.Code)
		writeProblem(w, *p)
		return
	}
	// Room for the batch in memory before it is read: a batch is read whole, and many
	// large ones at once would take what the process has.
	size := a.cfg.BatchMaxBytes
	if r.ContentLength >= 0 && r.ContentLength < size {
		size = r.ContentLength
	}
	if a.batchBytes.Add(size) > a.cfg.BatchInFlightBytes {
		a.batchBytes.Add(-size)
		a.cfg.Metrics.outcome("overloaded")
		writeProblem(w, problem{Status: http.StatusServiceUnavailable, Code: "overloaded", RetryAfter: time.Second,
			Detail: fmt.Sprintf("the batches being stored at once already take the limit of %d bytes (BATCH_INFLIGHT_BYTES); nothing of this one was stored; retry after the Retry-After delay", a.cfg.BatchInFlightBytes)})
		return
	}
	defer a.batchBytes.Add(-size)
	items, p := a.readBatch(w, r, mt)
	if p != nil {
		a.cfg.Metrics.outcome(p.Code)
		writeProblem(w, *p)
		return
	}
	now := time.Now()
	results := make([]batchResult, len(items))
	var reqs []request.Request
	var at []int // reqs[k] is item at[k]
	for i, raw := range items {
		results[i].Index = i
		req, p := a.parseItem(raw, now, scope)
		if p == nil {
			p = a.admit(r.Context(), scope, req)
		}
		if p != nil {
			results[i].fail(*p)
			a.cfg.Metrics.outcome(p.Code)
			continue
		}
		reqs, at = append(reqs, req), append(at, i)
	}
	// A slot per publish, as for single requests; the items that find none are told to
	// come back.
	taken := 0
	for taken < len(reqs) {
		select {
		case a.publishing <- struct{}{}:
			taken++
			continue
		default:
		}
		break
	}
	defer func() {
		for range taken {
			<-a.publishing
		}
	}()
	for k := taken; k < len(reqs); k++ {
		a.unadmit(scope, reqs[k])
		a.cfg.Metrics.outcome("overloaded")
		results[at[k]].fail(problem{Status: http.StatusServiceUnavailable, Code: "overloaded", RetryAfter: time.Second,
			Detail: "too many requests are being stored at once; this item was not accepted; retry it after the Retry-After delay"})
	}
	if taken > 0 {
		ctx := r.Context()
		if a.tracer != nil { // one span for the batch: each item stored is in its trace
			var span trace.Span
			ctx = tracing.Propagator.Extract(ctx, propagation.HeaderCarrier(r.Header))
			ctx, span = a.tracer.Start(ctx, "dispatch.accept_batch", trace.WithSpanKind(trace.SpanKindServer),
				trace.WithAttributes(attribute.Int("dispatch.items", len(items)), attribute.Int("dispatch.publishing", taken)))
			defer span.End()
			parent, state := tracing.Inject(ctx)
			for k := range taken {
				reqs[k].TraceParent, reqs[k].TraceState = parent, state
			}
		} else if parent, state := tracing.FromHeader(r.Header); parent != "" {
			// Tracing off: the caller's trace context, as it came, for raven.
			for k := range taken {
				reqs[k].TraceParent, reqs[k].TraceState = parent, state
			}
		}
		ctx, cancel := context.WithTimeout(ctx, a.cfg.PublishTimeout)
		start := time.Now()
		receipts, errs := a.pub.PublishAll(ctx, reqs[:taken])
		cancel()
		a.cfg.Metrics.published(time.Since(start))
		for k := range taken {
			res := &results[at[k]]
			if errs[k] == nil && receipts[k].Duplicate {
				a.unadmit(scope, reqs[k]) // counted when first stored
				errs[k] = a.sameBody(r.Context(), scope, reqs[k])
			}
			if errs[k] != nil {
				p := publishProblem(errs[k], a.cfg.BacklogRetryAfter)
				if !receipts[k].Duplicate {
					a.unadmit(scope, reqs[k])
				}
				a.cfg.Metrics.outcome(p.Code)
				res.fail(p)
				continue
			}
			a.stored(reqs[k], receipts[k])
			res.Status, res.ID, res.ClientID, res.Duplicate, res.NotBefore = request.StateQueued, reqs[k].ID, reqs[k].ClientID, receipts[k].Duplicate, reqs[k].NotBefore
		}
	}
	ans := batchAnswer{Results: results}
	var retry time.Duration
	for _, res := range results {
		if res.Problem != nil {
			ans.Failed++
			retry = max(retry, res.retry)
		} else {
			ans.Accepted++
		}
	}
	if retry > 0 { // what a caller resending the failed items should wait
		w.Header().Set("Retry-After", strconv.Itoa(int((retry+time.Second-1)/time.Second)))
	}
	writeJSON(w, http.StatusOK, ans)
}

func (res *batchResult) fail(p problem) {
	res.Status = "failed"
	res.Problem = &itemProblem{Status: p.Status, Code: p.Code, Detail: p.Detail}
	if p.RetryAfter > 0 {
		res.retry = p.RetryAfter
		res.Problem.RetryAfter = int((p.RetryAfter + time.Second - 1) / time.Second)
	}
}

// batchType checks what can be checked of a batch before its body is read: its
// Content-Type (the media type is returned) and its announced length.
func (a *API) batchType(r *http.Request) (string, *problem) {
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || (mt != "application/json" && mt != ndjson) {
		return "", &problem{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type",
			Detail: fmt.Sprintf("Content-Type %q: send a JSON array as application/json, or one item per line as %s", truncate(ct, 64), ndjson)}
	}
	if r.ContentLength > a.cfg.BatchMaxBytes {
		return "", a.batchTooLarge()
	}
	return mt, nil
}

// readBatch reads the batch's items, each as the raw JSON of its line or array element.
// A line of NDJSON that is not JSON is an item of its own (its problem is reported with
// it); an array that is not valid JSON is refused whole.
func (a *API) readBatch(w http.ResponseWriter, r *http.Request, mt string) ([]json.RawMessage, *problem) {
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(a.cfg.BodyTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, a.cfg.BatchMaxBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		var ne net.Error
		switch {
		case errors.As(err, &mbe):
			return nil, a.batchTooLarge()
		case errors.As(err, &ne) && ne.Timeout():
			return nil, &problem{Status: http.StatusRequestTimeout, Code: "body_timeout",
				Detail: fmt.Sprintf("the batch did not arrive within %s; nothing was stored", a.cfg.BodyTimeout)}
		}
		return nil, &problem{Status: http.StatusBadRequest, Code: "body_unreadable", Detail: "the batch could not be read completely; nothing was stored"}
	}
	var items []json.RawMessage
	if mt == ndjson {
		// Each item is a slice of body itself, which nothing changes until the batch is
		// stored (a line reader's buffer would be reused under the items already read).
		for rest := body; len(rest) > 0; {
			line := rest
			if i := bytes.IndexByte(rest, '\n'); i >= 0 {
				line, rest = rest[:i], rest[i+1:]
			} else {
				rest = nil
			}
			if line = bytes.TrimSpace(line); len(line) == 0 {
				continue
			}
			if len(items) == a.cfg.BatchMaxItems {
				return nil, a.batchTooMany()
			}
			items = append(items, line[:len(line):len(line)])
		}
	} else {
		var p *problem
		if items, p = a.splitArray(body); p != nil {
			return nil, p
		}
	}
	if len(items) == 0 { // valid JSON (or NDJSON of blank lines) that asks for nothing
		return nil, badRequest("batch_empty", "the batch has no items: send at least one; nothing was stored")
	}
	return items, nil
}

// splitArray returns the items of a batch sent as a JSON array: each element's raw JSON.
// A valid array is split by one scan; anything else goes through encoding/json's decoder,
// whose error says where the batch stopped being JSON.
func (a *API) splitArray(body []byte) ([]json.RawMessage, *problem) {
	var items []json.RawMessage
	if validJSON(body) {
		i := skipSpace(body, 0)
		if body[i] != '[' {
			return nil, badRequest("malformed_json", "a batch sent as application/json is a JSON array of items; nothing was stored")
		}
		for i = skipSpace(body, i+1); body[i] != ']'; i = skipSpace(body, i) {
			if body[i] == ',' {
				i = skipSpace(body, i+1)
			}
			if len(items) == a.cfg.BatchMaxItems {
				return nil, a.batchTooMany()
			}
			end := skipValue(body, i)
			items = append(items, body[i:end:end])
			i = end
		}
		return items, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return nil, badRequest("malformed_json", "a batch sent as application/json is a JSON array of items; nothing was stored")
	}
	for dec.More() {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, badRequest("malformed_json", fmt.Sprintf("the batch is not valid JSON after %d items (%s); nothing was stored", len(items), err))
		}
		if len(items) == a.cfg.BatchMaxItems {
			return nil, a.batchTooMany()
		}
		items = append(items, raw)
	}
	if _, err := dec.Token(); err != nil {
		return nil, badRequest("malformed_json", "the batch's array is not closed; nothing was stored")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, badRequest("malformed_json", "the batch has more after its array; nothing was stored")
	}
	return items, nil
}

func (a *API) batchTooLarge() *problem {
	return &problem{Status: http.StatusRequestEntityTooLarge, Code: "batch_too_large",
		Detail: fmt.Sprintf("the batch is larger than the limit of %d bytes (BATCH_MAX_BYTES); nothing was stored: send it in smaller batches", a.cfg.BatchMaxBytes)}
}

func (a *API) batchTooMany() *problem {
	return &problem{Status: http.StatusRequestEntityTooLarge, Code: "batch_too_large",
		Detail: fmt.Sprintf("the batch has more than the limit of %d items (BATCH_MAX_ITEMS); nothing was stored: send it in smaller batches", a.cfg.BatchMaxItems)}
}

// parseItem checks one item as a single request with its fields as headers would be
// checked, and returns the request to publish.
func (a *API) parseItem(raw json.RawMessage, now time.Time, scope *Scope) (request.Request, *problem) {
	it, p := decodeItem(raw)
	if p != nil {
		return request.Request{}, p
	}
	if it.ClientID == "" {
		return request.Request{}, badRequest("client_id_missing", `the item has no "clientId": every item names its client`)
	}
	if err := request.ValidateClientID(it.ClientID); err != nil {
		return request.Request{}, badRequest("client_id_invalid", err.Error()+"; a clientId is 1 to 128 bytes of UTF-8 text without control characters")
	}
	if len(it.Body) == 0 {
		return request.Request{}, badRequest("body_missing", `the item has no "body": it holds the JSON raven receives`)
	}
	if int64(len(it.Body)) > a.cfg.MaxBodyBytes {
		return request.Request{}, tooLarge(a.cfg.MaxBodyBytes)
	}
	id := request.NewID(now)
	if it.IdempotencyKey != nil {
		if err := request.ValidateIdempotencyKey(*it.IdempotencyKey); err != nil {
			return request.Request{}, badRequest("idempotency_key_invalid", err.Error())
		}
		id = scope.idFromKey(it.ClientID, *it.IdempotencyKey)
	}
	var notBefore, notAfter time.Time
	if it.NotBefore != nil {
		if notBefore, p = a.notBefore(*it.NotBefore, now); p != nil {
			return request.Request{}, p
		}
	}
	if it.NotAfter != nil {
		if notAfter, p = notAfterOf(*it.NotAfter, notBefore, now); p != nil {
			return request.Request{}, p
		}
	}
	return request.Request{ID: id, ClientID: it.ClientID, ContentType: "application/json", Body: it.Body, NotBefore: notBefore, NotAfter: notAfter}, nil
}

// decodeItem reads an item's fields, refusing what a single request's headers could not
// say unambiguously: a field twice, an unknown field, a field of the wrong type.
func decodeItem(raw json.RawMessage) (batchItem, *problem) {
	var it batchItem
	if !validJSON(raw) {
		return it, badRequest("malformed_json", "the item is not valid JSON")
	}
	if i := skipSpace(raw, 0); raw[i] != '{' {
		return it, badRequest("item_invalid", `an item is a JSON object: {"clientId": "...", "body": {...}}`)
	}
	var seen itemFields
	for rawKey, v := range members(raw) {
		key, ok := jsonString(rawKey)
		if !ok {
			return it, badRequest("malformed_json", "the item is not valid JSON")
		}
		if !seen.add(key) {
			return it, badRequest("item_invalid", fmt.Sprintf("the item has %q more than once; send it once", truncate(key, 64)))
		}
		var str string
		asString := func(code string) *problem {
			ok := len(v) > 0 && v[0] == '"'
			if ok {
				str, ok = jsonString(v)
			}
			if !ok {
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
			if len(v) > 0 && v[0] != '"' { // seconds from now, as a JSON number
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

// itemFields are the item fields seen so far, as bits in the order of itemFieldNames.
type itemFields uint8

var itemFieldNames = [...]string{"clientId", "body", "idempotencyKey", "notBefore", "notAfter"}

// add records key as seen; false if it was seen before. An unknown key is left for the
// caller to refuse.
func (f *itemFields) add(key string) bool {
	for i, name := range itemFieldNames {
		if key == name {
			if *f&(1<<i) != 0 {
				return false
			}
			*f |= 1 << i
		}
	}
	return true
}
