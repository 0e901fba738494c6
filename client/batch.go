package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// Item is one request of a batch.
type Item struct {
	// ClientID is the clientId the request is spaced under.
	ClientID string
	// Body is the JSON raven will receive, byte for byte.
	Body json.RawMessage
	// IdempotencyKey is sent as the item's key; when empty, SubmitBatch generates one,
	// used for every resend of the item.
	IdempotencyKey string
	// NotBefore, when not zero, is the earliest time the request may go to raven.
	NotBefore time.Time
	// NotAfter, when not zero, is the item's deadline, as WithNotAfter gives a Submit's:
	// not attempted by then, it is dead-lettered as "expired". It must lie ahead and
	// after NotBefore, else ingest refuses the item (a *Problem, code
	// not_after_invalid).
	NotAfter time.Time
}

// ItemResult is what became of one Item.
type ItemResult struct {
	// Receipt says where the item was stored when Err is nil. Its IdempotencyKey and
	// ClientID are set either way.
	Receipt Receipt
	// Err is nil when the item was stored. Otherwise it is a *Problem when ingest
	// refused the item for good; ErrClientIDMissing or ErrBodyNotJSON when it was
	// never sent; or, when the context ended (or MaxAttempts ran out) while the item
	// was still being retried, an error wrapping the context's error and the item's
	// last failure.
	Err error
}

// wireItem is an Item as it is sent: with its key, and NotBefore and NotAfter as
// text (empty for none).
type wireItem struct {
	ClientID       string
	Body           json.RawMessage
	IdempotencyKey string
	NotBefore      string
	NotAfter       string
}

// encodeBatch writes items as the JSON array POST /v1/requests/batch takes. Unlike
// json.Marshal, which compacts a json.RawMessage and escapes <, > and & in it, it puts
// each body in byte for byte: ingest hands raven a batch item's body exactly as it
// stands in the batch. Bodies must be valid JSON already.
func encodeBatch(items []wireItem) []byte {
	var b bytes.Buffer
	field := func(name, value string) {
		text, _ := json.Marshal(value) // a string always encodes
		b.WriteString(`,"` + name + `":`)
		b.Write(text)
	}
	b.WriteByte('[')
	for n, item := range items {
		if n > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"body":`)
		b.Write(item.Body)
		field("clientId", item.ClientID)
		if item.IdempotencyKey != "" {
			field("idempotencyKey", item.IdempotencyKey)
		}
		if item.NotBefore != "" {
			field("notBefore", item.NotBefore)
		}
		if item.NotAfter != "" {
			field("notAfter", item.NotAfter)
		}
		b.WriteByte('}')
	}
	b.WriteByte(']')
	return b.Bytes()
}

// batchAnswer is the JSON of a 200 to POST /v1/requests/batch.
type batchAnswer struct {
	Results []batchResult `json:"results"`
}

type batchResult struct {
	Index  int    `json:"index"`
	Status string `json:"status"`
	receiptAnswer
	Problem *wireProblem `json:"problem"`
}

// SubmitBatch stores many requests with ingest and returns one result per item, in
// the order of items. Batches larger than WithMaxBatchItems go as several requests,
// one after another. Items ingest turns away for now (429, 503) are sent again, alone
// and with their same keys, after the wait ingest asked for (plus jitter), until they
// are stored or the context ends; a whole batch turned away for now, or lost to a
// connection error, is sent again whole, with the same keys. Items that fail for good
// get a *Problem in their result.
//
// SubmitBatch returns an error only when ingest refused a whole batch for good (for
// example 401, or 413 batch_too_large); the results then still say which items were
// stored before that, and the others carry the error too.
func (c *Client) SubmitBatch(ctx context.Context, items []Item) ([]ItemResult, error) {
	results := make([]ItemResult, len(items))
	wire := make([]wireItem, len(items))
	var sendable []int
	for i, item := range items {
		key := item.IdempotencyKey
		if key == "" {
			key = newIdempotencyKey()
		}
		results[i].Receipt = Receipt{ClientID: item.ClientID, IdempotencyKey: key}
		if item.ClientID == "" {
			results[i].Err = fmt.Errorf("client: batch item %d: %w", i, ErrClientIDMissing)
			continue
		}
		if err := checkBody(item.Body); err != nil {
			results[i].Err = fmt.Errorf("client: batch item %d: %w", i, err)
			continue
		}
		wire[i] = wireItem{ClientID: item.ClientID, Body: item.Body, IdempotencyKey: key,
			NotBefore: timeText(item.NotBefore), NotAfter: timeText(item.NotAfter)}
		sendable = append(sendable, i)
	}
	for start := 0; start < len(sendable); start += c.maxBatchItems {
		chunk := sendable[start:min(start+c.maxBatchItems, len(sendable))]
		if err := c.submitChunk(ctx, wire, chunk, results); err != nil {
			for _, i := range sendable[start+len(chunk):] {
				results[i].Err = err // never sent
			}
			return results, err
		}
	}
	return results, nil
}

// submitChunk sends the items wire[i] for i in pending as one batch, and again those
// that may be retried, writing each item's fate into results[i]. It returns an error
// only for a whole batch refused for good, which becomes the fate of the items still
// pending then.
func (c *Client) submitChunk(ctx context.Context, wire []wireItem, pending []int, results []ItemResult) error {
	op := fmt.Sprintf("client: submitting a batch of %d items", len(pending))
	refused := func(err error) error {
		for _, i := range pending {
			results[i].Err = err
		}
		return err
	}
	header := http.Header{}
	header.Set("Content-Type", "application/json")
	r := retrier{policy: c.retry}
	batch := make([]wireItem, 0, len(pending))
	for len(pending) > 0 {
		batch = batch[:0]
		for _, i := range pending {
			batch = append(batch, wire[i])
		}
		data, o := c.exchange(ctx, http.MethodPost, "/v1/requests/batch", header, encodeBatch(batch))
		switch {
		case o.err == nil:
			var answer batchAnswer
			if err := json.Unmarshal(data, &answer); err != nil {
				return refused(fmt.Errorf("%s: decoding ingest's answer: %w", op, err))
			}
			again, retryAfter, err := settle(answer.Results, pending, results)
			if err != nil {
				return refused(fmt.Errorf("%s: %w", op, err))
			}
			pending = again
			if len(pending) == 0 {
				return nil
			}
			o = outcome{retry: true, retryAfter: retryAfter}
		case !o.retry:
			return refused(fmt.Errorf("%s: %w", op, o.err))
		case !causedByContext(ctx, o.err):
			for _, i := range pending {
				results[i].Err = o.err // the item's last failure, until the next try
			}
		}
		if reason := r.backOff(ctx, o.retryAfter); reason != nil {
			for _, i := range pending {
				results[i].Err = r.stopped(fmt.Sprintf("client: batch item for %s", wire[i].ClientID), reason, results[i].Err)
			}
			return nil
		}
	}
	return nil
}

// settle writes ingest's per-item answers into results, where answers[k] is about the
// item results[pending[k]]. It returns the items to send again and the longest wait
// ingest asked for among them.
func settle(answers []batchResult, pending []int, results []ItemResult) (again []int, retryAfter time.Duration, err error) {
	if len(answers) != len(pending) {
		return nil, 0, fmt.Errorf("ingest answered %d results for %d items", len(answers), len(pending))
	}
	seen := make([]bool, len(pending))
	for _, a := range answers { // all checked before any is written
		if a.Index < 0 || a.Index >= len(pending) || seen[a.Index] {
			return nil, 0, fmt.Errorf("ingest answered a result for item %d, which is out of range or answered twice", a.Index)
		}
		seen[a.Index] = true
	}
	for _, a := range answers {
		i := pending[a.Index]
		switch {
		case a.Status == "queued":
			results[i].Receipt = a.receipt(results[i].Receipt.IdempotencyKey)
			results[i].Err = nil
		case a.Status == "failed" && a.Problem != nil:
			p := a.Problem.problem()
			results[i].Err = p
			if p.retryable() {
				again = append(again, i)
				retryAfter = max(retryAfter, p.RetryAfter)
			}
		default:
			results[i].Err = fmt.Errorf("ingest answered the item with status %q and no problem", a.Status)
		}
	}
	return again, retryAfter, nil
}
