package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/penguinhq/dispatcher/pkg/ledger"
)

// load is penguin: clients that post at their own pace and in bursts, each request with
// an Idempotency-Key, retried after 429 and 503 as Retry-After says, and after a failed
// connection, until ingest answers 202.
type load struct {
	ingests  []string // base URLs
	interval time.Duration

	mu         sync.Mutex
	accepted   []ledger.Accepted
	statuses   map[int]int
	reads      map[string]int // status reads' answers (statuses.go)
	unexpected []string
	retries    int
	lastAccept atomic.Int64 // unix nanoseconds

	stop chan struct{}
	wg   sync.WaitGroup
}

func startLoad(ingests []string, clients int, interval time.Duration, seed uint64) *load {
	l := &load{ingests: ingests, interval: interval, statuses: map[int]int{}, reads: map[string]int{}, stop: make(chan struct{})}
	for c := range clients {
		rng := rand.New(rand.NewPCG(seed, uint64(c)+1))
		l.wg.Go(func() { l.client(fmt.Sprintf("penguin-%03d", c), rng) })
	}
	rng := rand.New(rand.NewPCG(seed, 0))
	l.wg.Go(func() { l.readStatuses(rng) })
	return l
}

func (l *load) halt() {
	close(l.stop)
	l.wg.Wait()
}

func (l *load) client(id string, rng *rand.Rand) {
	hc := &http.Client{Timeout: 10 * time.Second}
	for n := 0; ; {
		// About 70% of what the interval lets out, with bursts: a cycle sends 1.65
		// requests on average (one, or a burst of 3 to 12 one time in ten) and waits
		// 2.4 intervals on average, so that backlogs grow in bursts and faults and drain
		// between them. (At 1.6 intervals the load was 3% over what spacing lets out,
		// and a 30-minute run ended with a backlog no 5-minute drain could empty.)
		pause := time.Duration(rng.ExpFloat64() * float64(l.interval) * 2.4)
		select {
		case <-l.stop:
			return
		case <-time.After(pause):
		}
		burst := 1
		if rng.IntN(10) == 0 {
			burst = 3 + rng.IntN(10)
		}
		for range burst {
			n++
			if !l.send(hc, rng, id, n) {
				return
			}
		}
	}
}

// send posts one request until it is accepted; false when the load is stopping.
func (l *load) send(hc *http.Client, rng *rand.Rand, client string, n int) bool {
	body, _ := json.Marshal(map[string]any{"clientId": client, "n": n, "pad": strings.Repeat("p", rng.IntN(600))})
	key := client + "-" + strconv.Itoa(n)
	for {
		select {
		case <-l.stop:
			return false
		default:
		}
		req, _ := http.NewRequest(http.MethodPost, l.ingests[rng.IntN(len(l.ingests))]+"/v1/requests", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := hc.Do(req)
		if err != nil {
			l.count(0, client, "", "")
			time.Sleep(250 * time.Millisecond)
			continue
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusAccepted:
			var a struct{ ID, ClientID string }
			if json.Unmarshal(raw, &a) != nil || a.ID == "" {
				l.count(-1, client, "", fmt.Sprintf("202 with a body that names no id: %q", raw))
				return true
			}
			l.count(resp.StatusCode, client, a.ID, "")
			return true
		case http.StatusTooManyRequests, http.StatusServiceUnavailable:
			l.count(resp.StatusCode, client, "", "")
			wait := time.Second
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
				wait = time.Duration(s) * time.Second
			}
			wait = min(wait, 5*time.Second)
			time.Sleep(wait/2 + time.Duration(rng.Int64N(int64(wait)/2+1)))
		default:
			l.count(resp.StatusCode, client, "", fmt.Sprintf("%d %s", resp.StatusCode, raw))
			return true
		}
	}
}

func (l *load) count(status int, client, id, unexpected string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.statuses[status]++
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable || status == 0 {
		l.retries++
	}
	if id != "" {
		l.accepted = append(l.accepted, ledger.Accepted{ClientID: client, ID: id})
		l.lastAccept.Store(time.Now().UnixNano())
	}
	if unexpected != "" && len(l.unexpected) < 20 {
		l.unexpected = append(l.unexpected, unexpected)
	}
}
