package ingest_test

import (
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// stored stores nothing and acknowledges everything.
type stored struct{}

func (stored) Publish(context.Context, request.Request) (request.Receipt, error) {
	return request.Receipt{Seq: 1}, nil
}

func (s stored) PublishAll(ctx context.Context, rs []request.Request) ([]request.Receipt, []error) {
	receipts := make([]request.Receipt, len(rs))
	for i := range rs {
		receipts[i], _ = s.Publish(ctx, rs[i])
	}
	return receipts, make([]error, len(rs))
}

func (stored) Ready(context.Context) error { return nil }

// delivered says every request was delivered: a status read that asks to wait answers
// at once.
type delivered struct{}

func (delivered) StatusEvents(_ context.Context, _, id string) ([]request.Event, error) {
	return []request.Event{{Type: request.EventDelivered, ID: id, ClientID: "c", At: time.Now()}}, nil
}
func (delivered) Place(context.Context, request.Status) *request.QueuePlace { return nil }
func (delivered) WatchEvents(_, _ string, _ func(request.Event)) (func(), error) {
	return func() {}, nil
}
func (delivered) AskQueued(context.Context, string, string) (request.Found, bool, error) {
	return request.Found{}, false, nil
}

// serve answers one request with an ingest API configured by cfg.
func serve(t *testing.T, cfg ingest.Config, method, path, contentType, auth, body string) *httptest.ResponseRecorder {
	t.Helper()
	api, err := ingest.New(cfg, stored{}, stored{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	api.Handler().ServeHTTP(rec, req)
	return rec
}

type problemBody struct {
	Status int    `json:"status"`
	Code   string `json:"code"`
	Detail string `json:"detail"`
}

func problemOf(t *testing.T, rec *httptest.ResponseRecorder) problemBody {
	t.Helper()
	var p problemBody
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("%d %q is not a problem: %v", rec.Code, rec.Body, err)
	}
	return p
}

// A 405 names the methods the route takes in Allow, as RFC 9110 §15.5.6 requires.
func TestMethodNotAllowedSaysWhatIsAllowed(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ method, path, allow string }{
		{http.MethodGet, "/v1/requests", "POST"},
		{http.MethodPut, "/v1/openapi.json", "GET"},
		{http.MethodPut, "/v1/requests/01abc", "GET, DELETE"},
		{http.MethodPost, "/healthz", "GET"},
	} {
		rec := serve(t, ingest.Config{}, c.method, c.path, "", "", "")
		if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != c.allow || problemOf(t, rec).Code != "method_not_allowed" {
			t.Errorf("%s %s: %d, Allow %q, %s; want 405 method_not_allowed with Allow %q", c.method, c.path, rec.Code, rec.Header().Get("Allow"), rec.Body, c.allow)
		}
	}
}

// The Authorization scheme's name is case-insensitive (RFC 9110 §11.1): "bearer" and
// "BEARER" are Bearer. The token itself is not.
func TestBearerSchemeInAnyCase(t *testing.T) {
	t.Parallel()
	tokens, err := ingest.NewTokens("", []string{"t0k3n"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := ingest.Config{Tokens: tokens}
	for auth, want := range map[string]int{
		"Bearer t0k3n": http.StatusAccepted, "bearer t0k3n": http.StatusAccepted, "BEARER t0k3n": http.StatusAccepted,
		"bEaReR  t0k3n": http.StatusAccepted, "Bearer T0K3N": http.StatusUnauthorized, "Basic t0k3n": http.StatusUnauthorized,
		"Bearer": http.StatusUnauthorized, "Bearert0k3n": http.StatusUnauthorized, "": http.StatusUnauthorized,
	} {
		if rec := serve(t, cfg, http.MethodPost, "/v1/requests", "application/json", auth, `{"clientId":"a"}`); rec.Code != want {
			t.Errorf("Authorization %q: %d %s, want %d", auth, rec.Code, rec.Body, want)
		}
	}
}

// JSON answers are not HTML-escaped: a detail that says "<token>" reads "<token>", and a
// clientId with & or < comes back as it was sent.
func TestJSONAnswersAreNotHTMLEscaped(t *testing.T) {
	t.Parallel()
	tokens, err := ingest.NewTokens("", []string{"t0k3n"})
	if err != nil {
		t.Fatal(err)
	}
	rec := serve(t, ingest.Config{Tokens: tokens}, http.MethodPost, "/v1/requests", "application/json", "", `{"clientId":"a"}`)
	if body := rec.Body.String(); rec.Code != http.StatusUnauthorized || !strings.Contains(body, "Bearer <token>") || strings.Contains(body, `\u003c`) {
		t.Errorf("401 answered %d %s, want a detail naming Bearer <token> unescaped", rec.Code, body)
	}
	for _, path := range []string{"/v1/requests", "/v1/requests/batch"} {
		body := `{"clientId":"<b>&co"}`
		if strings.HasSuffix(path, "batch") {
			body = `[{"clientId":"<b>&co","body":{}}]`
		}
		rec = serve(t, ingest.Config{}, http.MethodPost, path, "application/json", "", body)
		if !strings.Contains(rec.Body.String(), `"clientId":"<b>&co"`) {
			t.Errorf("POST %s answered %d %s, want the clientId <b>&co as it was sent", path, rec.Code, rec.Body)
		}
	}
}

// An empty batch is valid JSON: it is refused as batch_empty, not malformed_json.
func TestAnEmptyBatchIsItsOwnProblem(t *testing.T) {
	t.Parallel()
	for ct, body := range map[string]string{"application/json": " [ ] ", "application/x-ndjson": "\n \n"} {
		rec := serve(t, ingest.Config{}, http.MethodPost, "/v1/requests/batch", ct, "", body)
		if p := problemOf(t, rec); rec.Code != http.StatusBadRequest || p.Code != "batch_empty" || !strings.Contains(p.Detail, "no items") {
			t.Errorf("%s %q: %d %+v, want 400 batch_empty saying the batch has no items", ct, body, rec.Code, p)
		}
	}
}

// A wait over MaxStatusWait is cut to it, not refused, and the answer says so; a wait
// within it is not marked.
func TestAStatusWaitOverTheCapIsCutAndSaysSo(t *testing.T) {
	t.Parallel()
	cfg := ingest.Config{Status: delivered{}, MaxStatusWait: 10 * time.Second}
	path := "/v1/requests/" + request.NewID(time.Now()) + "?clientId=c"
	rec := serve(t, cfg, http.MethodGet, path+"&wait=2m", "", "", "")
	if rec.Code != http.StatusOK || rec.Header().Get(ingest.WaitCappedHeader) != "10s" {
		t.Errorf("wait=2m with a cap of 10s: %d, %s: %q; want 200 with %[2]s: 10s", rec.Code, ingest.WaitCappedHeader, rec.Header().Get(ingest.WaitCappedHeader))
	}
	rec = serve(t, cfg, http.MethodGet, path+"&wait=10s", "", "", "")
	if rec.Code != http.StatusOK || rec.Header().Values(ingest.WaitCappedHeader) != nil {
		t.Errorf("wait=10s with a cap of 10s: %d, %s: %q; want 200 without it", rec.Code, ingest.WaitCappedHeader, rec.Header().Get(ingest.WaitCappedHeader))
	}
}

// Every problem code ingest can answer is in docs/producers.md's table of problem codes: a code
// added to the source (a Code field, a badRequest, a counted outcome) and not to the
// table fails here. The codes are read from the source of ingest and of httpapi (whose
// /readyz and 405 answers ingest serves).
func TestProducersPageListsEveryProblemCode(t *testing.T) {
	t.Parallel()
	var files []string
	for _, dir := range []string{".", "../httpapi"} {
		fs, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fs {
			if !strings.HasSuffix(f, "_test.go") {
				files = append(files, f)
			}
		}
	}
	codes := map[string]string{} // code -> where it was found
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		literal := func(e ast.Expr) {
			if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil {
					codes[s] = fset.Position(lit.Pos()).String()
				}
			}
		}
		ast.Inspect(file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.KeyValueExpr: // Problem{Code: "..."}
				if id, ok := n.Key.(*ast.Ident); ok && id.Name == "Code" {
					literal(n.Value)
				}
			case *ast.CallExpr: // badRequest("...", detail)
				if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "badRequest" && len(n.Args) > 0 {
					literal(n.Args[0])
				}
			}
			return true
		})
	}
	for _, o := range ingest.Outcomes {
		if _, ok := codes[o]; !ok && o != "accepted" && o != "duplicate" {
			codes[o] = "Outcomes"
		}
	}
	if len(codes) < 20 {
		t.Fatalf("found only %d codes in the source (%v): the search no longer matches it", len(codes), codes)
	}
	page, err := os.ReadFile("../../docs/producers.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| [0-9]{3} \\| `([a-z_]+)` \\|")
	var listed []string
	for _, m := range row.FindAllStringSubmatch(string(page), -1) {
		listed = append(listed, m[1])
	}
	for c, where := range codes {
		if !slices.Contains(listed, c) {
			t.Errorf("problem code %q (%s) is not in docs/producers.md's table of problem codes", c, where)
		}
	}
}

// A status read names the request's client (ADR 10): without it, or with one that is no
// clientId, the answer is a 400 that says what to send; with it, the status.
func TestAStatusReadNamesTheClient(t *testing.T) {
	t.Parallel()
	cfg := ingest.Config{Status: delivered{}}
	id := request.NewID(time.Now())
	for _, c := range []struct{ query, code, says string }{
		{"", "client_id_missing", "?clientId="},
		{"?wait=1s", "client_id_missing", "?clientId="},
		{"?clientId=", "client_id_missing", "?clientId="},
		{"?clientId=%01", "client_id_invalid", "clientId"},
	} {
		rec := serve(t, cfg, http.MethodGet, "/v1/requests/"+id+c.query, "", "", "")
		if p := problemOf(t, rec); rec.Code != http.StatusBadRequest || p.Code != c.code || !strings.Contains(p.Detail, c.says) {
			t.Errorf("GET /v1/requests/{id}%s: %d %+v, want 400 %s saying %q", c.query, rec.Code, p, c.code, c.says)
		}
	}
	if rec := serve(t, cfg, http.MethodGet, "/v1/requests/"+id+"?clientId=c", "", "", ""); rec.Code != http.StatusOK {
		t.Errorf("GET /v1/requests/{id}?clientId=c: %d %s, want 200", rec.Code, rec.Body)
	}
}
