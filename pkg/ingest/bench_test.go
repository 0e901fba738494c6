package ingest_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/queue"
)

// BenchmarkAccept is POST /v1/requests through the whole handler (router, bearer token,
// parse, publish to a real embedded JetStream server, answer), as the binary configures
// it, from parallel callers. Run by hand for its allocations per request:
//
//	go test -run '^$' -bench Accept -benchmem ./pkg/ingest
func BenchmarkAccept(b *testing.B) {
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{StoreDir: b.TempDir()}, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { emb.Server().Shutdown(); emb.Server().WaitForShutdown() })
	conn, err := queue.ConnectInProcess(emb.Server(), "bench", zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(conn.Close)
	q, err := conn.Open(context.Background(), queue.Config{}, queue.CreateOrUpdate)
	if err != nil {
		b.Fatal(err)
	}
	tokens, err := ingest.NewTokens("", []string{"t"})
	if err != nil {
		b.Fatal(err)
	}
	api, err := ingest.New(ingest.Config{Metrics: ingest.NewMetrics(prometheus.NewRegistry()), Tokens: tokens},
		q, q, zerolog.New(io.Discard).Level(zerolog.InfoLevel))
	if err != nil {
		b.Fatal(err)
	}
	h := api.Handler()
	bodies := make([][]byte, 1000)
	for i := range bodies {
		head := fmt.Sprintf(`{"clientId":"client-%04d","pad":"`, i)
		bodies[i] = []byte(head + strings.Repeat("x", 512-len(head)-2) + `"}`)
	}
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r := httptest.NewRequest(http.MethodPost, "/v1/requests", bytes.NewReader(bodies[n.Add(1)%int64(len(bodies))]))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Authorization", "Bearer t")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusAccepted {
				b.Fatalf("answered %d: %s", w.Code, w.Body)
			}
		}
	})
}
