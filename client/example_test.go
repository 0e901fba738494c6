package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	"github.com/penguinhq/dispatcher/client"
)

// newExampleIngest starts a stand-in for ingest: it queues whatever it is given under
// ids req-1, req-2, … and reports every id as delivered.
func newExampleIngest() *httptest.Server {
	var mu sync.Mutex
	next := 0
	newID := func() string {
		mu.Lock()
		defer mu.Unlock()
		next++
		return fmt.Sprintf("req-%d", next)
	}
	answer := func(w http.ResponseWriter, status int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(v)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/requests", func(w http.ResponseWriter, r *http.Request) {
		answer(w, http.StatusAccepted, map[string]any{"id": newID(), "clientId": r.Header.Get("X-Client-Id"), "status": "queued"})
	})
	mux.HandleFunc("POST /v1/requests/batch", func(w http.ResponseWriter, r *http.Request) {
		var items []struct {
			ClientID string `json:"clientId"`
		}
		_ = json.NewDecoder(r.Body).Decode(&items)
		results := make([]map[string]any, len(items))
		for i, item := range items {
			results[i] = map[string]any{"index": i, "status": "queued", "id": newID(), "clientId": item.ClientID}
		}
		answer(w, http.StatusOK, map[string]any{"results": results, "accepted": len(items), "failed": 0})
	})
	mux.HandleFunc("GET /v1/requests/{id}", func(w http.ResponseWriter, r *http.Request) {
		answer(w, http.StatusOK, map[string]any{"id": r.PathValue("id"), "clientId": "penguin-7",
			"status": "delivered", "attempts": 1, "ravenStatus": 200, "replays": 0,
			"response": map[string]any{"status": 200, "headers": map[string]string{"Content-Type": "application/json"}, "body": `{"eaten":true}`, "bodyBytes": 14}})
	})
	return httptest.NewServer(mux)
}

func ExampleNew() {
	ingest := newExampleIngest()
	defer ingest.Close()

	c, err := client.New(ingest.URL,
		client.WithToken("secret"),
		client.WithRetry(client.RetryPolicy{Base: 50 * time.Millisecond, Max: 5 * time.Second}))
	if err != nil {
		fmt.Println(err)
		return
	}
	receipt, err := c.Submit(context.Background(), "penguin-7", []byte(`{"fish":3}`))
	fmt.Println(receipt.ID, err)

	_, err = client.New("ingest.example:8080")
	fmt.Println(err)
	// Output:
	// req-1 <nil>
	// client: base URL "ingest.example:8080" is not an absolute http or https URL
}

func ExampleClient_Submit() {
	ingest := newExampleIngest()
	defer ingest.Close()
	c, err := client.New(ingest.URL)
	if err != nil {
		fmt.Println(err)
		return
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	receipt, err := c.Submit(ctx, "penguin-7", []byte(`{"fish":3}`),
		client.WithIdempotencyKey("order-1234"),
		client.WithDelay(10*time.Second))
	if err != nil {
		fmt.Println(err) // a *client.Problem when ingest refused it: see errors.As
		return
	}
	fmt.Println(receipt.ID, receipt.ClientID, receipt.IdempotencyKey, receipt.Duplicate)
	// Output: req-1 penguin-7 order-1234 false
}

func ExampleClient_SubmitBatch() {
	ingest := newExampleIngest()
	defer ingest.Close()
	c, err := client.New(ingest.URL)
	if err != nil {
		fmt.Println(err)
		return
	}

	results, err := c.SubmitBatch(context.Background(), []client.Item{
		{ClientID: "penguin-7", Body: json.RawMessage(`{"fish":1}`)},
		{ClientID: "penguin-8", Body: json.RawMessage(`{"fish":2}`)},
		{ClientID: "", Body: json.RawMessage(`{"fish":3}`)},
	})
	if err != nil {
		fmt.Println(err) // the whole batch was refused, e.g. 401
		return
	}
	for i, r := range results {
		if r.Err != nil {
			fmt.Println(i, "failed:", r.Err)
			continue
		}
		fmt.Println(i, r.Receipt.ID, r.Receipt.ClientID)
	}
	// Output:
	// 0 req-1 penguin-7
	// 1 req-2 penguin-8
	// 2 failed: client: batch item 2: the clientId is empty
}

func ExampleClient_Wait() {
	ingest := newExampleIngest()
	defer ingest.Close()
	c, err := client.New(ingest.URL)
	if err != nil {
		fmt.Println(err)
		return
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	receipt, err := c.Submit(ctx, "penguin-7", []byte(`{"fish":3}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	status, err := c.Wait(ctx, receipt.ClientID, receipt.ID)
	if err != nil {
		fmt.Println("still", status.State, err) // ctx ended first
		return
	}
	fmt.Println(status.ID, status.State, status.RavenStatus, status.Attempts)
	if status.Response != nil { // raven's answer, as the dispatcher kept it
		body, _ := status.Response.Body()
		fmt.Println(status.Response.Headers["Content-Type"], string(body))
	}
	// Output:
	// req-1 delivered 200 1
	// application/json {"eaten":true}
}

// Penguin answers its own caller with raven's reply, the call to raven durable and spaced
// by the dispatcher: Do stores the request once and returns when raven has answered.
func ExampleClient_Do() {
	ingest := newExampleIngest()
	defer ingest.Close()
	c, err := client.New(ingest.URL)
	if err != nil {
		fmt.Println(err)
		return
	}

	// Penguin's own handler (here called once, directly).
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st, err := c.Do(r.Context(), "penguin-7", []byte(`{"fish":4}`))
		if err != nil || st.Response == nil {
			http.Error(w, "raven did not answer in time; the request is queued", http.StatusGatewayTimeout)
			return
		}
		body, _ := st.Response.Body()
		w.Header().Set("Content-Type", st.Response.Headers["Content-Type"])
		w.WriteHeader(st.Response.Status)
		_, _ = w.Write(body)
	})
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/order", nil))
	fmt.Println(rec.Code, rec.Header().Get("Content-Type"), rec.Body.String())
	// Output: 200 application/json {"eaten":true}
}
