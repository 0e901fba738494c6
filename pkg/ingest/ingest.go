// Package ingest is the HTTP API penguin posts requests to. It validates a request,
// finds its clientId, hands it to the queue and answers 202 only once the queue has
// acknowledged it durably. Every refusal is application/problem+json with a detail a
// caller can act on; a refused request is never published.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/penguinhq/dispatcher/pkg/httpapi"
	"github.com/penguinhq/dispatcher/pkg/openapi"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/tracing"
)

// Publisher stores accepted requests durably. Its errors are request.ErrBacklogFull,
// request.ErrQueueFull or request.ErrUnavailable, possibly wrapped.
type Publisher interface {
	Publish(ctx context.Context, r request.Request) (request.Receipt, error)
	// PublishAll stores rs together, publishing them at once and waiting for every
	// acknowledgement: a receipt or an error for each, in order.
	PublishAll(ctx context.Context, rs []request.Request) ([]request.Receipt, []error)
}

// Announcer tells whoever listens now that a request was stored (its accepted event):
// a live notification, not stored; the queued request is the record of its acceptance
// (ADR 18). Announce must not block.
type Announcer interface {
	Announce(e request.Event)
}

// StatusReader reads requests' events, from which their statuses follow
// (request.StatusOf).
type StatusReader interface {
	// StatusEvents reads the events of request id of client clientID (ADR 10) that its
	// status follows from: enough for request.StatusOf.
	StatusEvents(ctx context.Context, clientID, id string) ([]request.Event, error)
	// Place says where a queued request stands in its client's queue; nil when it is
	// not queued or that cannot be read.
	Place(ctx context.Context, st request.Status) *request.QueuePlace
	// WatchEvents calls fn with each event of request id of client clientID written
	// from now on.
	WatchEvents(clientID, id string, fn func(request.Event)) (stop func(), err error)
	// AskQueued finds a request that has no status record in the queue itself (one not
	// attempted yet: the queued request is the record of its acceptance, ADR 18): what
	// the queue says of it, ok false when it is not queued.
	AskQueued(ctx context.Context, clientID, id string) (f request.Found, ok bool, err error)
}

// Readiness reports whether the queue can take requests now.
type Readiness interface {
	Ready(ctx context.Context) error
}

// API serves the ingest endpoints.
type API struct {
	cfg         Config
	pub         Publisher
	ready       Readiness
	log         zerolog.Logger
	publishing  *pool        // a slot per publish waiting for JetStream
	batchBytes  *pool        // bytes of the batches being read and stored
	waits       *pool        // a slot per status read waiting for a final state
	reads       *pool        // a slot per status read not waiting
	asks        *pool        // a slot per ask whether a request is queued (askQueued)
	cancelSlots *pool        // a slot per cancel being decided
	tracer      trace.Tracer // nil: tracing is off
	shares      *shares      // each tenant's (and unscoped token's) delayed requests
	backlogs    *backlogs    // who has a backlog; nil without Config.Backlogs
	cancels     Canceller    // nil: DELETE answers 501
}

// New returns the API. A pub that is also a Canceller (the queue) serves cancels. With
// tokens that are all unscoped it logs a warning saying how to scope them.
func New(cfg Config, pub Publisher, ready Readiness, log zerolog.Logger) (*API, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &API{cfg: cfg, pub: pub, ready: ready, log: log.With().Str("component", "ingest").Logger(), shares: newShares(),
		publishing:  newPool(int64(cfg.MaxPublishing), 1, "tenant_publishing_full", "publishes waiting for JetStream", "MAX_PUBLISHING"),
		batchBytes:  newPool(cfg.BatchInFlightBytes, cfg.BatchMaxBytes, "tenant_publishing_full", "bytes of batches being stored", "BATCH_INFLIGHT_BYTES"),
		waits:       newPool(int64(cfg.MaxStatusWaits), 1, "tenant_reads_full", "status reads waiting (?wait, Prefer: wait)", "MAX_STATUS_WAITS"),
		reads:       newPool(int64(cfg.MaxStatusReads), 1, "tenant_reads_full", "status reads", "MAX_STATUS_READS"),
		asks:        newPool(maxQueuedAsks, 1, "tenant_reads_full", "status reads asking the dispatchers whether a request is queued", fmt.Sprintf("this ingest's %d", maxQueuedAsks)),
		cancelSlots: newPool(maxCancels, 1, "tenant_cancels_full", "cancels being decided", fmt.Sprintf("this ingest's %d", maxCancels))}
	if cfg.Tokens != nil && cfg.Tokens.Unscoped() {
		a.log.Warn().Int("unscoped_delayed", DefaultUnscopedMaxDelayed).Int("unscoped_backlogs", DefaultUnscopedMaxBacklogs).
			Msg("every ingest token is unscoped: each may send for, and read, every client, within the unscoped shares; write a tokens file (INGEST_TOKENS_FILE) that gives each producer a tenant and its clients")
	}
	if c, ok := pub.(Canceller); ok {
		a.cancels = c
	}
	if cfg.Backlogs != nil {
		a.backlogs = newBacklogs(cfg.Backlogs, time.Second)
	}
	if cfg.Tracing != nil {
		a.tracer = cfg.Tracing.Tracer(tracing.Name)
	}
	return a, nil
}

// startAccept starts req's accept span, continuing the caller's trace context (or
// starting a trace), and stores the span's context with the request.
func (a *API) startAccept(r *http.Request, req *request.Request, name string) (context.Context, trace.Span) {
	ctx := tracing.Propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := a.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("dispatch.request_id", req.ID)))
	req.TraceParent, req.TraceState = tracing.Inject(ctx)
	return ctx, span
}

// endAccept ends an accept span with what became of the request.
func endAccept(span trace.Span, outcome string, status int) {
	span.SetAttributes(attribute.String("dispatch.outcome", outcome), attribute.Int("http.response.status_code", status))
	if status >= 500 {
		span.SetStatus(codes.Error, outcome)
	}
	span.End()
}

// Handler returns the routes:
//
//	POST /v1/requests        accept a request for dispatch
//	POST /v1/requests/batch  accept many (a JSON array or NDJSON)
//	GET  /v1/requests/{id}   a request's status (?wait=30s: until final)
//	DELETE /v1/requests/{id} cancel a queued request that is not in flight
//	GET  /v1/openapi.json    the API's OpenAPI document
//	GET  /healthz            the process is alive
//	GET  /readyz             the queue is reachable and its streams are in place
//
// Every answer carries the security headers of httpapi.SecurityHeaders.
func (a *API) Handler() http.Handler {
	r := chi.NewRouter()
	secure := httpapi.SecurityHeaders(httpapi.APIContentSecurityPolicy)
	r.Use(secure) // before routing: 404s and 405s carry them too
	single := a.authorize(a.accept)
	r.Method(http.MethodPost, "/v1/requests", single)
	r.Method(http.MethodPost, "/v1/requests/batch", a.authorize(a.acceptBatch))
	r.Method(http.MethodGet, "/v1/requests/{id}", notBatch(a.authorize(a.status)))
	r.Method(http.MethodDelete, "/v1/requests/{id}", notBatch(a.authorize(a.cancel)))
	r.Method(http.MethodGet, "/v1/openapi.json", openapi.Handler(openapi.Ingest()))
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	r.Method(http.MethodGet, "/readyz", httpapi.Ready(a.ready.Ready, "the queue is not reachable, its streams are not in place, or its store does not take writes; the log says which", a.log))
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, problem{Status: http.StatusNotFound, Code: "not_found", Detail: fmt.Sprintf("no route %s %s; requests go to POST /v1/requests", r.Method, truncate(r.URL.EscapedPath(), 128))})
	})
	r.MethodNotAllowed(httpapi.MethodNotAllowed(r)) // with the Allow header RFC 9110 requires
	return router{Mux: r, single: secure(single)}
}

// notBatch answers 405 for /v1/requests/batch, which the router would otherwise give
// to h as a request named "batch": the batch route takes only POST.
func notBatch(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if chi.URLParam(r, "id") != "batch" {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Allow", http.MethodPost)
		writeProblem(w, problem{Status: http.StatusMethodNotAllowed, Code: "method_not_allowed",
			Detail: fmt.Sprintf("%s is not allowed on /v1/requests/batch; it takes POST", r.Method)})
	})
}

// router is the routes, with the one every request takes found without the router's
// context (a copy of the request per request): the same handler chi would find there.
type router struct {
	*chi.Mux
	single http.Handler
}

func (rt router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost && r.URL.Path == "/v1/requests" && r.URL.RawPath == "" {
		rt.single.ServeHTTP(w, r)
		return
	}
	rt.Mux.ServeHTTP(w, r)
}

type accepted struct {
	ID        string        `json:"id"`
	ClientID  string        `json:"clientId"`
	Status    request.State `json:"status"`
	Duplicate bool          `json:"duplicate,omitempty"`
	NotBefore time.Time     `json:"notBefore,omitzero"`
}

func (a *API) accept(w http.ResponseWriter, r *http.Request, scope *Scope) {
	wait, waits, p := preferWait(r.Header)
	if p != nil {
		a.answerProblem(w, *p)
		return
	}
	buf := getBuffer()
	defer func() {
		if buf != nil { // after the publish returned: nats.go holds no part of the body then
			putBuffer(buf)
		}
	}()
	req, p := a.parse(w, r, buf, scope)
	if p == nil {
		p = a.admit(r.Context(), scope, req)
	}
	if p != nil {
		a.answerProblem(w, *p)
		return
	}
	release, publishing := a.takePublishing(w, scope, req) // given back when the publish is done
	if !publishing {
		return
	}
	defer func() {
		if publishing {
			release()
		}
	}()
	var wt *waiting // Prefer: wait, its watch started before the request is stored
	if waits && a.cfg.Status != nil {
		if wt = a.startWait(scope, req.ClientID, req.ID, wait); wt != nil {
			defer wt.release()
		}
	}
	ctx := r.Context()
	var span trace.Span
	if a.tracer != nil {
		ctx, span = a.startAccept(r, &req, "dispatch.accept")
	} else {
		// Tracing off: the caller's trace context is stored as it came, for raven.
		req.TraceParent, req.TraceState = tracing.FromHeader(r.Header)
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.PublishTimeout)
	defer cancel()
	start := time.Now()
	receipt, err := a.pub.Publish(ctx, req)
	a.cfg.Metrics.published(time.Since(start))
	if err == nil && receipt.Duplicate {
		err = a.sameBody(ctx, scope, req, receipt.Seq)
	}
	if err != nil {
		a.refuse(w, scope, req, span, err)
		return
	}
	if span != nil {
		span.SetAttributes(attribute.Bool("dispatch.duplicate", receipt.Duplicate), attribute.Int64("dispatch.seq", int64(receipt.Seq)))
		endAccept(span, "accepted", http.StatusAccepted)
	}
	if receipt.Duplicate {
		a.unadmit(scope, req) // it was counted when first stored
	}
	acc := a.stored(req, receipt)
	if wt != nil {
		release() // not held through the wait
		publishing = false
		cancel()
		putBuffer(buf) // the body is stored: a wait does not hold it
		buf = nil
		if a.answerWhenFinal(w, r, scope, wt, acc, receipt.Duplicate) {
			return
		}
	}
	writeAccepted(w, accepted{ID: req.ID, ClientID: req.ClientID, Status: request.StateQueued, Duplicate: receipt.Duplicate, NotBefore: acc.NotBefore})
}

// takePublishing takes a publishing slot for req within its token's share; without one,
// it answers the refusal and gives req's admission back.
func (a *API) takePublishing(w http.ResponseWriter, scope *Scope, req request.Request) (release func(), ok bool) {
	release, refusal, ok := a.takeSlot(scope, a.publishing, 0)
	if ok {
		return release, true
	}
	a.unadmit(scope, req)
	if refusal == nil {
		refusal = &problem{Status: http.StatusServiceUnavailable, Code: "overloaded", RetryAfter: time.Second,
			Detail: "too many requests are being stored at once; this one was not accepted; retry after the Retry-After delay"}
	}
	a.answerProblem(w, *refusal)
	return nil, false
}

// refuse answers a request the queue did not store (err) with its problem.
func (a *API) refuse(w http.ResponseWriter, scope *Scope, req request.Request, span trace.Span, err error) {
	p := publishProblem(err, a.cfg.BacklogRetryAfter)
	a.unadmit(scope, req)
	if span != nil {
		endAccept(span, p.Code, p.Status)
	}
	// Debug, like every refusal: while the queue is unavailable every request would log
	// the same line. The queue logs once when its store stops taking writes, NATS when
	// the connection drops, and the outcomes are counted.
	if ev := a.log.Debug(); ev.Enabled() {
		ev.Func(tracing.Log(req.TraceParent)).Err(err).Str("client_id", req.ClientID).Str("request_id", req.ID).Int("status", p.Status).Msg("request refused")
	}
	a.answerProblem(w, p)
}

// answerProblem counts p's code as the request's outcome and answers with it.
func (a *API) answerProblem(w http.ResponseWriter, p problem) {
	a.cfg.Metrics.outcome(p.Code)
	writeProblem(w, p)
}

// stored counts and announces a request the queue acknowledged: its accepted event goes
// to whoever listens now (Config.Live), fire and forget, and is not stored (ADR 18). It
// returns the event.
func (a *API) stored(req request.Request, receipt request.Receipt) (accepted request.Event) {
	if receipt.Duplicate {
		a.cfg.Metrics.outcome("duplicate")
	} else {
		a.cfg.Metrics.outcome("accepted")
	}
	now := time.Now()
	accepted = request.Event{Type: request.EventAccepted, ID: req.ID, ClientID: req.ClientID, At: now,
		Seq: receipt.Seq, NotBefore: req.NotBefore, NotAfter: req.NotAfter, AcceptedAt: now, Instance: a.cfg.Instance,
		Duplicate: receipt.Duplicate}
	if receipt.Duplicate {
		// The stored copy keeps the times it was first sent with; this copy's would tell
		// its status, and the answer, what the queue does not hold.
		accepted.NotBefore, accepted.NotAfter = time.Time{}, time.Time{}
	}
	if a.cfg.Live != nil {
		a.cfg.Live.Announce(accepted)
	}
	if ev := a.log.Debug(); ev.Enabled() {
		ev.Func(tracing.Log(req.TraceParent)).Str("client_id", req.ClientID).Str("request_id", req.ID).Uint64("seq", receipt.Seq).Bool("duplicate", receipt.Duplicate).Msg("request accepted")
	}
	return accepted
}

// publishProblem is the one map from queue errors to HTTP answers.
func publishProblem(err error, backlogRetry time.Duration) problem {
	switch {
	case errors.Is(err, request.ErrBacklogFull):
		return problem{Status: http.StatusTooManyRequests, Code: "backlog_full", RetryAfter: backlogRetry,
			Detail: "this client's backlog is at its cap; nothing queued was dropped; retry after the Retry-After delay"}
	case errors.As(err, new(*reusedKey)):
		return problem{Status: http.StatusConflict, Code: "idempotency_key_reused", Detail: err.Error()}
	case errors.Is(err, request.ErrQueueFull):
		return problem{Status: http.StatusServiceUnavailable, Code: "queue_full", RetryAfter: 30 * time.Second,
			Detail: "the queue is at its size limit; nothing queued was dropped; retry after the Retry-After delay"}
	default:
		return problem{Status: http.StatusServiceUnavailable, Code: "queue_unavailable", RetryAfter: time.Second,
			Detail: "the request could not be stored durably just now and was not accepted; retry after the Retry-After delay"}
	}
}
