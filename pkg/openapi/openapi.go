// Package openapi holds the OpenAPI 3.1 documents of the service's HTTP APIs, built into
// the binary: the ingest API penguin posts requests to, and the admin API on the
// dispatcher's operators' listener. They are the contract: the tests in this package
// hold them to the routers that serve the APIs, and package openapitest holds every
// answer that other packages' tests see to them.
package openapi

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
)

var (
	//go:embed ingest.json
	ingest []byte
	//go:embed admin.json
	admin []byte
)

// Ingest returns the ingest API's document (JSON). The caller may not modify it.
func Ingest() []byte { return ingest }

// Admin returns the admin API's document (JSON), its paths as mounted on the operators'
// listener (/admin/v1/...). The caller may not modify it.
func Admin() []byte { return admin }

// Handler serves doc as application/json to GET and HEAD, with a strong ETag (of its
// content) and Cache-Control: no-cache, so that caches revalidate it and get 304 while it
// is unchanged.
func Handler(doc []byte) http.Handler {
	sum := sha256.Sum256(doc)
	etag := `"` + hex.EncodeToString(sum[:16]) + `"`
	length := strconv.Itoa(len(doc))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("ETag", etag)
		h.Set("Cache-Control", "no-cache")
		if matches(r.Header.Values("If-None-Match"), etag) {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", length)
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			_, _ = w.Write(doc)
		}
	})
}

// matches says whether an If-None-Match header names etag (weakly, as RFC 9110 has it
// for If-None-Match), or is "*".
func matches(values []string, etag string) bool {
	for _, v := range values {
		for tag := range strings.SplitSeq(v, ",") {
			tag = strings.TrimPrefix(strings.TrimSpace(tag), "W/")
			if tag == etag || tag == "*" {
				return true
			}
		}
	}
	return false
}
