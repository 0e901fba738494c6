package ingest

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// The request envelope and its headers: whatever the body, Content-Type, X-Client-Id
// and Idempotency-Key, parse either returns a request with a valid clientId and the body
// unchanged, or a 4xx problem with a code and a detail; it never panics. A clientId taken
// from the body is exactly the body's top-level "clientId" string.
func FuzzParse(f *testing.F) {
	f.Add("application/json", "", "", []byte(`{"clientId":"alice","n":1}`))
	f.Add("application/json", "bob", "k-1", []byte(`{}`))
	f.Add("application/json", "", "", []byte(`{"clientId":"a","clientId":"b"}`))
	f.Add("application/json", "", "", []byte(`{"clientId":42}`))
	f.Add("application/json", "", "", []byte(`{"x":{"clientId":"a"}}`))
	f.Add("application/json", "", "", []byte("{\"clientId\":\"a\xffb\"}"))
	f.Add("application/json", "", "", []byte(`[[[[[[[[[[[[[[[[`))
	f.Add("text/plain", "", "", []byte(`{"clientId":"a"}`))
	f.Add("application/vnd.x+json; charset=utf-8", "a\x01", "k\t", []byte(`{"clientId":"a.>"}`))
	api, err := New(Config{MaxBodyBytes: 4096}, nil, nil, zerolog.Nop())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, ct, clientHeader, key string, body []byte) {
		r := httptest.NewRequest(http.MethodPost, "/v1/requests", bytes.NewReader(body))
		r.Header.Set("Content-Type", ct)
		if clientHeader != "" {
			r.Header.Set(request.HeaderClientID, clientHeader)
		}
		if key != "" {
			r.Header.Set(request.HeaderIdempotencyKey, key)
		}
		req, p := api.parse(httptest.NewRecorder(), r, nil, nil)
		if p != nil {
			if p.Status < 400 || p.Status > 499 || p.Code == "" || p.Detail == "" {
				t.Fatalf("problem %+v is not a 4xx with a code and a detail", *p)
			}
			return
		}
		if err := request.ValidateClientID(req.ClientID); err != nil {
			t.Fatalf("accepted an invalid clientId %q: %v", req.ClientID, err)
		}
		if !bytes.Equal(req.Body, body) || req.ID == "" {
			t.Fatalf("accepted request changed the body or has no id")
		}
		if clientHeader == "" {
			var top map[string]json.RawMessage
			if json.Unmarshal(body, &top) == nil {
				var want string
				if json.Unmarshal(top["clientId"], &want) == nil && want != req.ClientID {
					t.Fatalf("clientId %q taken, but the body's top-level clientId is %q", req.ClientID, want)
				}
			}
		} else if req.ClientID != clientHeader {
			t.Fatalf("clientId %q taken, but X-Client-Id is %q", req.ClientID, clientHeader)
		}
	})
}
