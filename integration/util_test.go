package integration

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

func readAll(r *http.Request) ([]byte, error) { return io.ReadAll(r.Body) }

func newHTTPServer(t testing.TB, h http.Handler) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}
