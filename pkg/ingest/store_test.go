package ingest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// Bodies are read into buffers that are reused once their publish returned: under many
// concurrent callers, with bodies of every size and with and without a Content-Length,
// every stored request holds exactly the body that was accepted for its id.
func TestConcurrentBodiesAreStoredIntact(t *testing.T) {
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{StoreDir: t.TempDir()}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emb.Server().Shutdown(); emb.Server().WaitForShutdown() })
	conn, err := queue.ConnectInProcess(emb.Server(), "test", zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	ctx := context.Background()
	q, err := conn.Open(ctx, queue.Config{}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	api, err := ingest.New(ingest.Config{}, q, q, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)

	const callers, each = 32, 40
	sent := make(map[string][]byte) // id -> body
	var mu sync.Mutex
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			for i := range each {
				pad := strings.Repeat(string(rune('a'+(c+i)%26)), (c*each+i)*37%9000)
				body := []byte(fmt.Sprintf(`{"clientId":"c%02d-%d","n":%d,"pad":%q}`, c, i%5, i, pad))
				var rd io.Reader = bytes.NewReader(body)
				if i%3 == 0 {
					rd = io.MultiReader(rd) // no Content-Length: sent chunked
				}
				resp, err := http.Post(srv.URL+"/v1/requests", "application/json", rd)
				if err != nil {
					t.Error(err)
					return
				}
				var a struct{ ID string }
				err = json.NewDecoder(resp.Body).Decode(&a)
				resp.Body.Close()
				if resp.StatusCode != http.StatusAccepted || err != nil {
					t.Errorf("answered %d (%v)", resp.StatusCode, err)
					return
				}
				mu.Lock()
				sent[a.ID] = body
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	nc, err := nats.Connect("", nats.InProcessServer(emb.Server()))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	stream, err := js.Stream(ctx, queue.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	stored := 0
	for seq := uint64(1); seq <= uint64(callers*each); seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		id := m.Header.Get(request.HeaderID)
		want, ok := sent[id]
		if !ok {
			t.Fatalf("message %d has id %q, which no caller was answered", seq, id)
		}
		if !bytes.Equal(m.Data, want) {
			t.Fatalf("request %s stored with a body of %d bytes that differs from the %d accepted", id, len(m.Data), len(want))
		}
		stored++
	}
	if stored != len(sent) {
		t.Fatalf("%d stored, %d accepted", stored, len(sent))
	}
}
