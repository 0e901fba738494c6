package ingest_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/natsnode"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// BenchmarkAccept is POST /v1/requests through the whole handler (router, bearer token,
// parse, publish to a real embedded JetStream server, answer), as the binary configures
// it, from parallel callers. Run by hand for its allocations per request:
//
//	go test -run '^$' -bench Accept -benchmem ./pkg/ingest
func BenchmarkAccept(b *testing.B) {
	q := benchQueue(b)
	tokens, err := ingest.NewTokens("", []string{"t"})
	if err != nil {
		b.Fatal(err)
	}
	api, err := ingest.New(ingest.Config{Metrics: ingest.NewMetrics(prometheus.NewRegistry()), Tokens: tokens},
		q, q, zerolog.New(io.Discard).Level(zerolog.InfoLevel))
	if err != nil {
		b.Fatal(err)
	}
	benchHandler(b, api.Handler())
}

// BenchmarkMinimal is the reference for BenchmarkAccept: the least a handler must do (read
// the body, find the clientId by a plain search, publish it with a message id, answer
// 202), against the same kind of server, from the same callers.
func BenchmarkMinimal(b *testing.B) {
	benchQueue(b)
	nc, err := nats.Connect("", nats.InProcessServer(benchServer))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	var seq atomic.Uint64
	key := []byte(`"clientId":"`)
	benchHandler(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		c := body[bytes.Index(body, key)+len(key):]
		c = c[:bytes.IndexByte(c, '"')]
		msg := &nats.Msg{Subject: request.RequestSubject(string(c)), Data: body}
		if _, err := js.PublishMsg(r.Context(), msg, jetstream.WithMsgID(strconv.FormatUint(seq.Add(1), 36)), jetstream.WithExpectStream(queue.RequestStream)); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}))
}

var benchServer *server.Server

// benchQueue starts an embedded JetStream server (benchServer) and opens the queue on it.
func benchQueue(b *testing.B) *queue.Queue {
	emb, err := natsnode.StartEmbedded(natsnode.EmbeddedConfig{StoreDir: b.TempDir()}, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	benchServer = emb.Server()
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
	return q
}

// benchHandler posts 512-byte bodies for a thousand clients to h from 64 parallel callers.
func benchHandler(b *testing.B, h http.Handler) {
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
