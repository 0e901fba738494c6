package openapi_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/openapi"
	"github.com/penguinhq/dispatcher/pkg/openapi/openapitest"
)

var docs = map[string][]byte{"ingest": openapi.Ingest(), "admin": openapi.Admin()}

// TestDocuments holds each document to OpenAPI 3.1: it builds as a model, it is valid
// against the OpenAPI 3.1 schema, and every $ref in it points at something.
func TestDocuments(t *testing.T) {
	t.Parallel()
	for name, doc := range docs {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d, err := libopenapi.NewDocument(doc)
			if err != nil {
				t.Fatalf("reading: %v", err)
			}
			if v := d.GetVersion(); v != "3.1.0" {
				t.Errorf("openapi %q, want 3.1.0", v)
			}
			if _, err := d.BuildV3Model(); err != nil {
				t.Fatalf("building the model: %v", err)
			}
			v, errs := validator.NewValidator(d)
			if len(errs) > 0 {
				t.Fatalf("building the validator: %v", errs)
			}
			if ok, errs := v.ValidateDocument(); !ok {
				for _, e := range errs {
					t.Errorf("not valid OpenAPI 3.1: %s", e.Error())
					for _, f := range e.SchemaValidationErrors {
						t.Errorf("\t%s", f.Error())
					}
				}
			}
			for _, ref := range unresolved(t, doc) {
				t.Errorf("$ref %s points at nothing", ref)
			}
		})
	}
}

// unresolved returns the local $refs of doc that do not resolve, and fails on any other.
func unresolved(t *testing.T, doc []byte) []string {
	t.Helper()
	var root any
	if err := json.Unmarshal(doc, &root); err != nil {
		t.Fatal(err)
	}
	var bad []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if ref, ok := v["$ref"].(string); ok {
				if !strings.HasPrefix(ref, "#/") {
					t.Errorf("$ref %s is not local: the documents stand alone", ref)
				} else if !resolves(root, ref) {
					bad = append(bad, ref)
				}
			}
			for _, e := range v {
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(root)
	return bad
}

func resolves(root any, ref string) bool {
	cur := root
	for tok := range strings.SplitSeq(strings.TrimPrefix(ref, "#/"), "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		m, ok := cur.(map[string]any)
		if !ok {
			return false
		}
		if cur, ok = m[tok]; !ok {
			return false
		}
	}
	return true
}

// TestRouteCoverage compares the routes the real routers serve with the operations the
// documents describe, both ways.
func TestRouteCoverage(t *testing.T) {
	t.Parallel()
	t.Run("ingest", func(t *testing.T) {
		t.Parallel()
		api, err := ingest.New(ingest.Config{}, publisher{}, readiness{}, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		compareRoutes(t, served(t, api.Handler(), ""), openapitest.Routes(t, openapi.Ingest()))
	})
	t.Run("admin", func(t *testing.T) {
		t.Parallel()
		// Only the router is needed, never a handler: a Service without a queue will do.
		h := new(admin.Service).Handler("token")
		compareRoutes(t, served(t, h, "/admin"), openapitest.Routes(t, openapi.Admin()))
	})
}

// chiParam is a chi route parameter with a pattern, {id:[0-9]+}: OpenAPI's is {id}.
var chiParam = regexp.MustCompile(`\{([^}:]+):[^}]*\}`)

// served walks a chi router and returns its routes as "METHOD /prefix/path".
func served(t *testing.T, h http.Handler, prefix string) []string {
	t.Helper()
	routes, ok := h.(chi.Routes)
	if !ok {
		t.Fatalf("the handler is a %T, not a chi router: walk its routes some other way", h)
	}
	var out []string
	err := chi.Walk(routes, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		route = chiParam.ReplaceAllString(route, "{$1}")
		out = append(out, method+" "+prefix+route)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func compareRoutes(t *testing.T, served, documented []string) {
	t.Helper()
	for _, r := range served {
		if !slices.Contains(documented, r) {
			t.Errorf("served but not documented: %s", r)
		}
	}
	for _, r := range documented {
		if !slices.Contains(served, r) {
			t.Errorf("documented but not served: %s", r)
		}
	}
}

// TestHandler serves a document as its own contract says: JSON, a strong ETag,
// Cache-Control, and 304 for a copy that is current.
func TestHandler(t *testing.T) {
	t.Parallel()
	for name, doc := range docs {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path := "/v1/openapi.json"
			if name == "admin" {
				path = "/admin/v1/openapi.json"
			}
			srv := httptest.NewServer(openapi.Handler(doc))
			t.Cleanup(srv.Close)
			client := &http.Client{Transport: openapitest.NewChecker(t, doc).Transport(t, nil)}

			resp := get(t, client, srv.URL+path, "")
			etag := resp.Header.Get("ETag")
			if resp.StatusCode != http.StatusOK || !strings.HasPrefix(etag, `"`) || resp.Header.Get("Cache-Control") == "" ||
				resp.Header.Get("Content-Type") != "application/json" || string(resp.body) != string(doc) {
				t.Fatalf("GET: %d, ETag %q, Cache-Control %q, Content-Type %q, the document served: %t", resp.StatusCode, etag,
					resp.Header.Get("Cache-Control"), resp.Header.Get("Content-Type"), string(resp.body) == string(doc))
			}
			if resp := get(t, client, srv.URL+path, etag); resp.StatusCode != http.StatusNotModified || len(resp.body) != 0 {
				t.Errorf("GET If-None-Match %s: %d with %d bytes, want 304 and none", etag, resp.StatusCode, len(resp.body))
			}
			if resp := get(t, client, srv.URL+path, `W/`+etag+`, "other"`); resp.StatusCode != http.StatusNotModified {
				t.Errorf("GET If-None-Match W/%s: %d, want 304", etag, resp.StatusCode)
			}
			if resp := get(t, client, srv.URL+path, `"other"`); resp.StatusCode != http.StatusOK {
				t.Errorf(`GET If-None-Match "other": %d, want 200`, resp.StatusCode)
			}
		})
	}
}

type response struct {
	*http.Response
	body []byte
}
