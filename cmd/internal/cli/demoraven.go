package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/httpapi"
	"github.com/penguinhq/dispatcher/pkg/ledger"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/webhook"
)

// DemoRaven is a stand-in raven that accepts every request and logs each arrival with
// the gap since that client's previous one. With record, it also keeps every arrival
// and lists them at GET /arrivals (for end-to-end checks; memory grows with traffic).
//
// So that operators can rehearse failures, it refuses the requests of chosen clients
// with a chosen status: fail holds the rules at start (ParseFailRules), and
// PUT /fail/{clientId} (the status as the body), DELETE /fail/{clientId} and GET /fail
// change and show them while it runs. A rule "prefix*" matches every clientId that
// starts with prefix.
//
// Given signing secrets (RAVEN_SIGNING_SECRET), it verifies each request's Standard
// Webhooks signature as a raven should, and refuses one that does not verify, or is more
// than five minutes old, with 401.
func DemoRaven(log zerolog.Logger, record bool, fail map[string]int, signing []webhook.Secret) http.Handler {
	dlog := log.With().Str("component", "demo-raven").Logger()
	rules := &failRules{m: maps.Clone(fail)}
	if rules.m == nil {
		rules.m = map[string]int{}
	}
	rec := ledger.New(ledger.Options{Forget: !record,
		Respond: func(a ledger.Arrival) ledger.Response {
			// A short JSON answer, which the status read shows as raven's response.
			status := rules.status(a.ClientID)
			body := map[string]any{"received": a.ID, "clientId": a.ClientID, "attempt": a.Attempt}
			if status >= 300 {
				body = map[string]any{"error": fmt.Sprintf("the demo raven refuses %s's requests with %d (DEMO_RAVEN_FAIL)", a.ClientID, status)}
			}
			b, _ := json.Marshal(body)
			return ledger.Response{Status: status, ContentType: "application/json", Body: b}
		},
		OnArrival: func(a ledger.Arrival, gap time.Duration) {
			ev := dlog.Info().Str("client_id", a.ClientID).Str("request_id", a.ID).Int("attempt", a.Attempt).Int("status", a.Status)
			if gap > 0 {
				ev = ev.Int64("gap_ms", gap.Milliseconds())
			} else {
				ev = ev.Str("gap_ms", "first")
			}
			ev.Msg("raven received")
		}})
	mux := http.NewServeMux()
	var post http.Handler = rec
	if len(signing) > 0 {
		post = verifySignatures(signing, rec, dlog)
	}
	mux.Handle("POST /", post)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /fail", func(w http.ResponseWriter, _ *http.Request) { httpapi.WriteJSON(w, http.StatusOK, rules.all()) })
	mux.HandleFunc("PUT /fail/{client}", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(io.LimitReader(r.Body, 16))
		rule := r.PathValue("client")
		status, err := failStatus(rule, strings.TrimSpace(string(b)))
		if err != nil {
			httpapi.WriteJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		if !rules.set(rule, status) {
			httpapi.WriteJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("at most %d rules", maxFailRules)})
			return
		}
		dlog.Warn().Str("rule", rule).Int("status", status).Msg("demo raven now refuses these clients' requests")
		httpapi.WriteJSON(w, http.StatusOK, rules.all())
	})
	mux.HandleFunc("DELETE /fail/{client}", func(w http.ResponseWriter, r *http.Request) {
		rules.set(r.PathValue("client"), 0)
		dlog.Info().Str("rule", r.PathValue("client")).Msg("demo raven accepts these clients' requests again")
		httpapi.WriteJSON(w, http.StatusOK, rules.all())
	})
	if record {
		mux.HandleFunc("GET /arrivals", func(w http.ResponseWriter, _ *http.Request) {
			as := rec.Arrivals()
			for i := range as {
				as[i].Header, as[i].Body = nil, nil
			}
			httpapi.WriteJSON(w, http.StatusOK, as)
		})
	}
	return mux
}

// maxSignedBody bounds the body the demo raven reads to verify its signature: above
// NATS's largest message, so no request the dispatcher sends is refused for its size.
const maxSignedBody = 64 << 20

// verifySignatures passes on the requests whose signature verifies under one of
// secrets and refuses the others with 401, as a raven checks what it receives.
func verifySignatures(secrets []webhook.Secret, next http.Handler, log zerolog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxSignedBody))
		if err != nil {
			httpapi.WriteJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"error": err.Error()})
			return
		}
		if err := webhook.Verify(secrets, r.Header, body, time.Now()); err != nil {
			log.Warn().Str("client_id", r.Header.Get(request.HeaderClientID)).Str("request_id", r.Header.Get(request.HeaderIdempotencyKey)).
				Str("error", err.Error()).Msg("raven refused a request whose signature does not verify")
			httpapi.WriteJSON(w, http.StatusUnauthorized, map[string]string{"error": err.Error()})
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

// failRules are the demo raven's refusals: clientId (or "prefix*") to status.
type failRules struct {
	mu sync.Mutex
	m  map[string]int
}

func (f *failRules) status(client string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok := f.m[client]; ok {
		return s
	}
	status, longest := http.StatusOK, -1
	for rule, s := range f.m { // the longest prefix wins
		if prefix, ok := strings.CutSuffix(rule, "*"); ok && strings.HasPrefix(client, prefix) && len(prefix) > longest {
			status, longest = s, len(prefix)
		}
	}
	return status
}

// maxFailRules bounds the rules, so that the unauthenticated /fail endpoint cannot grow
// the demo raven's memory without end. (The demo raven is for rehearsals: it has no
// authentication, and listens on loopback unless told otherwise.)
const maxFailRules = 1000

func (f *failRules) set(rule string, status int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if status == 0 {
		delete(f.m, rule)
		return true
	}
	if _, ok := f.m[rule]; !ok && len(f.m) >= maxFailRules {
		return false
	}
	f.m[rule] = status
	return true
}

func (f *failRules) all() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.m)
}

// DemoFailSetting registers DEMO_RAVEN_FAIL.
func DemoFailSetting(s *Settings, p *string) {
	s.String(p, "DEMO_RAVEN_FAIL", "", "the demo raven refuses these clients' requests: clientId=status pairs, comma-separated (bob=503,test-*=400); change them while it runs with PUT or DELETE /fail/{clientId}")
}

// ParseFailRules reads DEMO_RAVEN_FAIL: comma-separated clientId=status pairs, for
// example "bob=503,carol=400,test-*=500".
func ParseFailRules(s string) (map[string]int, error) {
	out := map[string]int{}
	for pair := range strings.SplitSeq(s, ",") {
		if pair = strings.TrimSpace(pair); pair == "" {
			continue
		}
		rule, status, ok := strings.Cut(pair, "=")
		if !ok {
			return nil, fmt.Errorf("%q: want clientId=status, for example bob=503", pair)
		}
		n, err := failStatus(strings.TrimSpace(rule), strings.TrimSpace(status))
		if err != nil {
			return nil, err
		}
		out[strings.TrimSpace(rule)] = n
	}
	return out, nil
}

func failStatus(rule, status string) (int, error) {
	if err := request.ValidateClientID(strings.TrimSuffix(rule, "*")); err != nil {
		return 0, fmt.Errorf("%q: %v", rule, err)
	}
	n, err := strconv.Atoi(status)
	if err != nil || n < 300 || n > 599 {
		return 0, fmt.Errorf("%s: status %q: want a number from 300 to 599 (4xx but 408, 425 and 429 dead-letter at once; 5xx, 408, 425 and 429 are retried)", rule, status)
	}
	return n, nil
}
