package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/penguinhq/dispatcher/pkg/httpapi"
	"github.com/penguinhq/dispatcher/pkg/openapi"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// Handler serves the admin API, to be mounted at /admin, each call authorized by
// "Authorization: Bearer <token>" (the scheme's name in any case). An empty token turns
// the API off: every call gets 403 saying how to turn it on. A method a route does not
// take gets 405 with the Allow header naming those it does.
func (s *Service) Handler(token string) http.Handler {
	r := chi.NewRouter()
	r.Use(s.authorize(token))
	r.Get("/v1/clients", s.handle(s.getClients))                      // ?sort=backlog|age|next&limit=&page=&search=
	r.Get("/v1/requests/{id}", s.handle(s.getRequest))                // ?client=
	r.Delete("/v1/requests/{id}", s.handle(s.deleteRequest))          // ?client= (cancel)
	r.Get("/v1/deadletters", s.handle(s.getDeadLetters))              // ?client=&id=&reason=&since=&until=&limit=
	r.Post("/v1/replay", s.handle(s.postReplay))                      // {"id","client","reason","since","until","all","dryRun"}
	r.Get("/v1/steering", s.handle(s.getSteering))                    //
	r.Get("/v1/status", s.handle(s.getStatus))                        // instances, partitions, NATS health
	r.Put("/v1/interval", s.handle(s.putInterval))                    // {"interval":"10s"} ("default": DISPATCH_INTERVAL)
	r.Get("/v1/budget", s.handle(s.getBudget))                        // raven's budget, and each instance's share
	r.Put("/v1/budget", s.handle(s.putBudget))                        // {"maxRate":500,"maxInFlight":"configured"}
	r.Put("/v1/client/interval", s.steerHandler(s.putClientInterval)) // {"client","interval"}
	r.Post("/v1/client/pause", s.steerHandler(s.postPause))           // {"client"}
	r.Post("/v1/client/resume", s.steerHandler(s.postResume))         // {"client"}
	r.Post("/v1/client/purge", s.steerHandler(s.postPurge))           // {"client","confirm","wait"}
	r.Method(http.MethodGet, "/v1/openapi.json", openapi.Handler(openapi.Admin()))
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteProblem(w, httpapi.Problem{Status: http.StatusNotFound, Code: "not_found", Detail: fmt.Sprintf("no admin route %s %s", r.Method, r.URL.Path)})
	})
	r.MethodNotAllowed(httpapi.MethodNotAllowed(r))
	return r
}

// authorize lets through only calls that carry token; with no token, none. Tokens are
// compared by their SHA-256 digests (equal lengths whatever was sent: a comparison of
// the raw strings returns at once on a length that differs, telling the token's length).
// The right token passes at once, whatever else came from its address. Every refusal is
// logged and counted; wrong tokens are throttled (httpapi.Throttle) as the console's
// sign-in's are: past its bounds a wrong one gets 429 with Retry-After.
func (s *Service) authorize(token string) func(http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	throttle := httpapi.NewThrottle(httpapi.ThrottleConfig{}) // the handler's own: one per listener
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if token == "" {
				httpapi.WriteProblem(w, httpapi.Problem{Status: http.StatusForbidden, Code: "admin_disabled",
					Detail: "the admin API is off: set ADMIN_TOKEN on the dispatcher to turn it on"})
				return
			}
			got, ok := httpapi.BearerToken(req) // "bearer" too: the scheme's case does not matter
			sum := sha256.Sum256([]byte(got))
			if ok && subtle.ConstantTimeCompare(sum[:], want[:]) == 1 {
				next.ServeHTTP(w, req)
				return
			}
			s.countRefusal()
			if wait, everyone := throttle.Wrong(httpapi.ThrottleKey(req), time.Now()); wait > 0 {
				from := map[bool]string{false: "this address", true: "all addresses together"}[everyone]
				s.log.Warn().Str("remote", req.RemoteAddr).Str("path", req.URL.Path).Bool("everyone", everyone).Msg("admin API call held back: too many wrong tokens from " + from)
				httpapi.WriteProblem(w, httpapi.Problem{Status: http.StatusTooManyRequests, Code: "throttled", RetryAfter: wait,
					Detail: "too many calls with a wrong token from " + from + "; retry after the Retry-After delay (the right token is never held back)"})
				return
			}
			s.log.Warn().Str("remote", req.RemoteAddr).Str("path", req.URL.Path).Bool("token_sent", ok).Msg("admin API call refused: wrong or missing token")
			w.Header().Set("WWW-Authenticate", `Bearer realm="dispatch-admin"`)
			httpapi.WriteProblem(w, httpapi.Problem{Status: http.StatusUnauthorized, Code: "unauthorized",
				Detail: "send the admin token as Authorization: Bearer <ADMIN_TOKEN>"})
		})
	}
}

func (s *Service) countRefusal() {
	if s.refused != nil {
		s.refused.Inc()
	}
}

func (s *Service) getClients(r *http.Request) (any, error) {
	q := r.URL.Query()
	limit, err1 := atoiOr(q.Get("limit"), 0)
	page, err2 := atoiOr(q.Get("page"), 0)
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return s.Clients(r.Context(), ClientsQuery{Sort: q.Get("sort"), Limit: limit, Page: page, Search: q.Get("search")})
}

func (s *Service) getRequest(r *http.Request) (any, error) {
	return s.Request(r.Context(), chi.URLParam(r, "id"), r.URL.Query().Get("client"))
}

func (s *Service) deleteRequest(r *http.Request) (any, error) {
	return s.Cancel(r.Context(), r.URL.Query().Get("client"), chi.URLParam(r, "id"))
}

func (s *Service) getDeadLetters(r *http.Request) (any, error) {
	q := r.URL.Query()
	f, err := FilterOf(q.Get("id"), q.Get("client"), q.Get("reason"), q.Get("since"), q.Get("until"), time.Now())
	if err != nil {
		return nil, err
	}
	limit, err := atoiOr(q.Get("limit"), 100)
	if err != nil {
		return nil, err
	}
	if q.Get("body") == "true" { // with headers and bodies: at most MaxBodies
		list, total, err := s.DeadLetterBodies(r.Context(), f, limit)
		return DeadLettersPage[DeadLetterBody]{Total: total, DeadLetters: list}, err
	}
	list, total, err := s.DeadLetters(r.Context(), f, limit)
	return DeadLettersPage[request.DeadLetter]{Total: total, DeadLetters: list}, err
}

// DeadLettersPage is a page of dead letters, with how many the filter selects.
type DeadLettersPage[T request.DeadLetter | DeadLetterBody] struct {
	Total       int `json:"total"`
	DeadLetters []T `json:"deadLetters"`
}

// maxReplayItems is the most items a replay's answer lists; the report counts them all.
const maxReplayItems = 1000

func (s *Service) postReplay(r *http.Request) (any, error) {
	var b struct {
		ID, Client, Reason, Since, Until string
		All                              bool
		Through                          uint64
		DryRun                           bool `json:"dryRun"`
	}
	if err := decode(r, &b); err != nil {
		return nil, err
	}
	f, err := FilterOf(b.ID, b.Client, b.Reason, b.Since, b.Until, time.Now())
	if err != nil {
		return nil, err
	}
	f.Through = b.Through
	items := []ReplayItem{}
	rep, err := s.Replay(r.Context(), f, b.All, b.DryRun, func(it ReplayItem) {
		if len(items) < maxReplayItems {
			items = append(items, it)
		}
	})
	return map[string]any{"report": rep, "items": items}, err
}

func (s *Service) getSteering(r *http.Request) (any, error) { return s.Steering(r.Context()) }

func (s *Service) getStatus(r *http.Request) (any, error) { return s.Status(r.Context()) }

func (s *Service) putInterval(r *http.Request) (any, error) {
	var b struct{ Interval string }
	if err := decode(r, &b); err != nil {
		return nil, err
	}
	d, err := ParseInterval(b.Interval)
	if err != nil {
		return nil, err
	}
	if _, err := s.SetInterval(r.Context(), d, by(r)); err != nil {
		return nil, err
	}
	return s.Steering(r.Context())
}

func (s *Service) getBudget(r *http.Request) (any, error) { return s.Budget(r.Context()) }

func (s *Service) putBudget(r *http.Request) (any, error) {
	var b struct {
		MaxRate     json.RawMessage `json:"maxRate"`
		MaxInFlight json.RawMessage `json:"maxInFlight"`
	}
	if err := decode(r, &b); err != nil {
		return nil, err
	}
	rate, err1 := numberOrWord(b.MaxRate, "maxRate")
	inflight, err2 := numberOrWord(b.MaxInFlight, "maxInFlight")
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return s.SetBudget(r.Context(), BudgetChange{MaxRate: rate, MaxInFlight: inflight}, by(r))
}

// numberOrWord reads a JSON number or string as text; absent or null is empty.
func numberOrWord(raw json.RawMessage, field string) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String(), nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	return "", invalid("%s: a number, or %q", field, Configured)
}

// clientBody is the body of every call that steers one client.
type clientBody struct {
	Client, Interval, Confirm, Wait string
}

// steerHandler reads a clientBody and hands it to do, with who is asking.
func (s *Service) steerHandler(do func(ctx context.Context, b clientBody, by string) (any, error)) http.HandlerFunc {
	return s.handle(func(r *http.Request) (any, error) {
		var b clientBody
		if err := decode(r, &b); err != nil {
			return nil, err
		}
		return do(r.Context(), b, by(r))
	})
}

func (s *Service) putClientInterval(ctx context.Context, b clientBody, by string) (any, error) {
	d, err := ParseInterval(b.Interval)
	if err != nil {
		return nil, err
	}
	return s.SetClientInterval(ctx, b.Client, d, by)
}

func (s *Service) postPause(ctx context.Context, b clientBody, by string) (any, error) {
	return s.Pause(ctx, b.Client, by)
}

func (s *Service) postResume(ctx context.Context, b clientBody, by string) (any, error) {
	return s.Resume(ctx, b.Client, by)
}

func (s *Service) postPurge(ctx context.Context, b clientBody, by string) (any, error) {
	wait := time.Duration(0)
	if b.Wait != "" {
		var err error
		if wait, err = time.ParseDuration(b.Wait); err != nil || wait < 0 || wait > maxPurgeWait {
			return nil, invalid("wait %q: a duration from 0s to %s", b.Wait, maxPurgeWait)
		}
	}
	return s.Purge(ctx, b.Client, b.Confirm, by, wait)
}

// maxPurgeWait bounds how long a purge call waits, well within the listener's write
// timeout, so that the answer is never cut off.
const maxPurgeWait = 30 * time.Second

// by names who made a change through the API, for the steering record and the log.
func by(r *http.Request) string { return "admin-api " + r.RemoteAddr }

func (s *Service) handle(fn func(*http.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var out any
		err := httpapi.CheckQuery(r)
		if err != nil {
			err = invalid("%s", err)
		} else {
			out, err = fn(r)
		}
		switch {
		case errors.Is(err, errTooLarge):
			httpapi.WriteProblem(w, httpapi.Problem{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large", Detail: err.Error()})
		case errors.Is(err, ErrInvalid):
			httpapi.WriteProblem(w, httpapi.Problem{Status: http.StatusBadRequest, Code: "invalid", Detail: err.Error()})
		case errors.Is(err, ErrConflict):
			httpapi.WriteProblem(w, httpapi.Problem{Status: http.StatusConflict, Code: "conflict", Detail: err.Error()})
		case errors.Is(err, ErrNotFound):
			httpapi.WriteProblem(w, httpapi.Problem{Status: http.StatusNotFound, Code: "not_found", Detail: err.Error()})
		case errors.Is(err, ErrUnavailable):
			httpapi.WriteProblem(w, httpapi.Problem{Status: http.StatusServiceUnavailable, Code: "unavailable", RetryAfter: time.Second, Detail: err.Error()})
		case err != nil:
			// The cause goes to the log, not to the caller.
			s.log.Warn().Err(err).Str("path", r.URL.Path).Msg("admin call failed")
			httpapi.WriteProblem(w, httpapi.Problem{Status: http.StatusServiceUnavailable, Code: "unavailable", RetryAfter: time.Second,
				Detail: "the queue could not be read or written just now; the dispatcher's log says why; retry after the Retry-After delay"})
		default:
			httpapi.WriteJSON(w, http.StatusOK, out)
		}
	}
}

// maxBody is the most an admin call's JSON body may hold.
const maxBody = 64 << 10

// errTooLarge is a body over maxBody: 413.
var errTooLarge = fmt.Errorf("the body is larger than the limit of %d bytes", maxBody)

func decode(r *http.Request, v any) error {
	data, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	switch {
	case err != nil: // its cause (a socket's addresses, a timeout) is not the caller's to read
		return invalid("the body could not be read whole (sent too slowly, or cut off)")
	case len(data) > maxBody:
		return errTooLarge
	}
	if err := decodeStrict(data, v); err != nil {
		return invalid("body: %s", err)
	}
	return nil
}

func atoiOr(s string, def int) (int, error) {
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, invalid("%q is not a whole number", s)
	}
	return n, nil
}
