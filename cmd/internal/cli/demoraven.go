package cli

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/ledger"
)

// DemoRaven is a stand-in raven that accepts every request and logs each arrival with
// the gap since that client's previous one. With record, it also keeps every arrival
// and lists them at GET /arrivals (for end-to-end checks; memory grows with traffic).
func DemoRaven(log zerolog.Logger, record bool) http.Handler {
	dlog := log.With().Str("component", "demo-raven").Logger()
	rec := ledger.New(ledger.Options{Forget: !record, OnArrival: func(a ledger.Arrival, gap time.Duration) {
		ev := dlog.Info().Str("client_id", a.ClientID).Str("request_id", a.ID).Int("attempt", a.Attempt)
		if gap > 0 {
			ev = ev.Int64("gap_ms", gap.Milliseconds())
		} else {
			ev = ev.Str("gap_ms", "first")
		}
		ev.Msg("raven received")
	}})
	mux := http.NewServeMux()
	mux.Handle("POST /", rec)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	if record {
		mux.HandleFunc("GET /arrivals", func(w http.ResponseWriter, _ *http.Request) {
			as := rec.Arrivals()
			for i := range as {
				as[i].Header, as[i].Body = nil, nil
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(as)
		})
	}
	return mux
}
