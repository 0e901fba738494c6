package ingest

import (
	"context"
	"encoding/json"
	"fmt"
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
		a.answerProblem(w, *p)
		return
	}
	// Room for the batch in memory before it is read: a batch is read whole, and many
	// large ones at once would take what the process has.
	size := a.cfg.BatchMaxBytes
	if r.ContentLength >= 0 && r.ContentLength < size {
		size = r.ContentLength
	}
	key, share := a.share(scope, a.batchBytes, 0)
	if ok, over := a.batchBytes.takeAll(key, share, size); !ok {
		p := problem{Status: http.StatusServiceUnavailable, Code: "overloaded", RetryAfter: time.Second,
			Detail: fmt.Sprintf("the batches being stored at once already take the limit of %d bytes (BATCH_INFLIGHT_BYTES); nothing of this one was stored; retry after the Retry-After delay", a.cfg.BatchInFlightBytes)}
		if over {
			p = a.batchBytes.overShare(share, false)
		}
		a.answerProblem(w, p)
		return
	}
	defer a.batchBytes.give(key, size)
	items, p := a.readBatch(w, r, mt)
	if p != nil {
		a.answerProblem(w, *p)
		return
	}
	results, reqs, at := a.parseItems(r.Context(), items, scope)
	// A slot per publish, as for single requests, within the token's share; the items
	// that find none are told to come back.
	key, share = a.share(scope, a.publishing, 0)
	took, over := a.publishing.takeUpTo(key, share, int64(len(reqs)))
	defer a.publishing.give(key, took)
	taken := int(took)
	for k := taken; k < len(reqs); k++ {
		a.unadmit(scope, reqs[k])
		p := problem{Status: http.StatusServiceUnavailable, Code: "overloaded", RetryAfter: time.Second,
			Detail: "too many requests are being stored at once; this item was not accepted; retry it after the Retry-After delay"}
		if over {
			p = a.publishing.overShare(share, false)
		}
		a.cfg.Metrics.outcome(p.Code)
		results[at[k]].fail(p)
	}
	if taken > 0 {
		ctx, endSpan := a.traceBatch(r, reqs[:taken], len(items))
		defer endSpan()
		ctx, cancel := context.WithTimeout(ctx, a.cfg.PublishTimeout)
		start := time.Now()
		receipts, errs := a.pub.PublishAll(ctx, reqs[:taken])
		cancel()
		a.cfg.Metrics.published(time.Since(start))
		for k := range taken {
			a.recordItem(r.Context(), scope, &results[at[k]], reqs[k], receipts[k], errs[k])
		}
	}
	answerBatch(w, results)
}

// parseItems parses and admits each item: results has one entry per item (those refused
// failed already), reqs the requests to store, reqs[k] being item at[k].
func (a *API) parseItems(ctx context.Context, items []json.RawMessage, scope *Scope) (results []batchResult, reqs []request.Request, at []int) {
	now := time.Now()
	results = make([]batchResult, len(items))
	for i, raw := range items {
		results[i].Index = i
		req, p := a.parseItem(raw, now, scope)
		if p == nil {
			p = a.admit(ctx, scope, req)
		}
		if p != nil {
			results[i].fail(*p)
			a.cfg.Metrics.outcome(p.Code)
			continue
		}
		reqs, at = append(reqs, req), append(at, i)
	}
	return results, reqs, at
}

// traceBatch starts the batch's one span, when tracing is on, and gives every request to
// store its trace context (tracing off: the caller's, as it came, for raven). end ends the
// span.
func (a *API) traceBatch(r *http.Request, reqs []request.Request, items int) (ctx context.Context, end func()) {
	ctx, end = r.Context(), func() {}
	if a.tracer != nil { // one span for the batch: each item stored is in its trace
		var span trace.Span
		ctx = tracing.Propagator.Extract(ctx, propagation.HeaderCarrier(r.Header))
		ctx, span = a.tracer.Start(ctx, "dispatch.accept_batch", trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.Int("dispatch.items", items), attribute.Int("dispatch.publishing", len(reqs))))
		parent, state := tracing.Inject(ctx)
		for k := range reqs {
			reqs[k].TraceParent, reqs[k].TraceState = parent, state
		}
		return ctx, func() { span.End() }
	}
	if parent, state := tracing.FromHeader(r.Header); parent != "" {
		for k := range reqs {
			reqs[k].TraceParent, reqs[k].TraceState = parent, state
		}
	}
	return ctx, end
}

// recordItem records what the queue answered for one item (err, or its receipt) in res.
func (a *API) recordItem(ctx context.Context, scope *Scope, res *batchResult, req request.Request, receipt request.Receipt, err error) {
	if err == nil && receipt.Duplicate {
		a.unadmit(scope, req) // counted when first stored
		err = a.sameBody(ctx, scope, req, receipt.Seq)
	}
	if err != nil {
		p := publishProblem(err, a.cfg.BacklogRetryAfter)
		if !receipt.Duplicate {
			a.unadmit(scope, req)
		}
		a.cfg.Metrics.outcome(p.Code)
		res.fail(p)
		return
	}
	acc := a.stored(req, receipt)
	res.Status, res.ID, res.ClientID, res.Duplicate, res.NotBefore = string(request.StateQueued), req.ID, req.ClientID, receipt.Duplicate, acc.NotBefore
}

// answerBatch answers with every item's result, and with Retry-After when a failed
// item should wait before it is sent again.
func answerBatch(w http.ResponseWriter, results []batchResult) {
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
	if err := request.ValidateNewClientID(it.ClientID); err != nil {
		return request.Request{}, clientIDInvalid(err)
	}
	if len(it.Body) == 0 {
		return request.Request{}, badRequest("body_missing", `the item has no "body": it holds the JSON raven receives`)
	}
	if p := sameClient(it.ClientID, it.Body, `the item's "clientId"`); p != nil {
		return request.Request{}, p
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
	return request.Request{ID: id, ClientID: it.ClientID, ContentType: "application/json", Body: it.Body, NotBefore: notBefore, NotAfter: notAfter,
		BodyDigest: request.BodyDigestOf(id, it.Body)}, nil
}

// decodeItem reads an item's fields, refusing what a single request's headers could not
// say unambiguously: a field twice, an unknown field, a field of the wrong type.
func decodeItem(raw json.RawMessage) (batchItem, *problem) {
	var it batchItem
	if !validJSON(raw) {
		return it, badRequest("malformed_json", "the item is not valid JSON"+whyNotJSON(raw))
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
