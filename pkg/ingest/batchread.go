package ingest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// batchType checks what can be checked of a batch before its body is read: its
// Content-Type (the media type is returned) and its announced length.
func (a *API) batchType(r *http.Request) (string, *problem) {
	ct, p := contentType(r.Header)
	if p != nil {
		return "", p
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || (!isJSONType(mt) && mt != ndjson) {
		return "", &problem{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type",
			Detail: fmt.Sprintf("Content-Type %q: send a JSON array as application/json, or one item per line as %s", truncate(ct, 64), ndjson)}
	}
	if p := encoded(r.Header); p != nil {
		return "", p
	}
	for _, h := range itemHeaders {
		if r.Header.Get(h.header) != "" { // else taken for the batch's, and silently not
			return "", badRequest(h.code, fmt.Sprintf("a batch does not read the %s header: give each item its own %q", h.header, h.field))
		}
	}
	if r.ContentLength > a.cfg.BatchMaxBytes {
		return "", a.batchTooLarge()
	}
	return mt, nil
}

// itemHeaders are the single request's headers that a batch takes as each item's
// fields instead.
var itemHeaders = []struct{ header, field, code string }{
	{request.HeaderClientID, "clientId", "client_id_invalid"},
	{request.HeaderIdempotencyKey, "idempotencyKey", "idempotency_key_invalid"},
	{HeaderNotBefore, "notBefore", "not_before_invalid"},
	{HeaderNotAfter, "notAfter", "not_after_invalid"},
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
