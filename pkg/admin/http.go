package admin

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/penguinhq/dispatcher/pkg/httpapi"
	"github.com/penguinhq/dispatcher/pkg/queue"
)

// Handler serves the admin API, to be mounted at /admin, each call authorized by
// "Authorization: Bearer <token>". An empty token turns the API off: every call gets 403
// saying how to turn it on.
//
//	GET  /admin/v1/clients?sort=backlog|age&limit=&page=
//	GET  /admin/v1/requests/{id}?client=
//	GET  /admin/v1/deadletters?client=&id=&reason=&since=&until=&limit=
//	POST /admin/v1/replay          {"id","client","reason","since","until","all","dry_run"}
//	GET  /admin/v1/steering
//	PUT  /admin/v1/interval        {"interval":"10s"}  ("0s": back to DISPATCH_INTERVAL)
//	PUT  /admin/v1/client/interval {"client","interval"}
//	POST /admin/v1/client/pause    {"client"}
//	POST /admin/v1/client/resume   {"client"}
//	POST /admin/v1/client/purge    {"client","confirm","wait"}
func (s *Service) Handler(token string) http.Handler {
	r := chi.NewRouter()
	r.Use(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if token == "" {
				httpapi.WriteProblem(w, httpapi.Problem{Status: http.StatusForbidden, Code: "admin_disabled",
					Detail: "the admin API is off: set ADMIN_TOKEN on the dispatcher to turn it on"})
				return
			}
			got, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="dispatch-admin"`)
				httpapi.WriteProblem(w, httpapi.Problem{Status: http.StatusUnauthorized, Code: "unauthorized",
					Detail: "send the admin token as Authorization: Bearer <ADMIN_TOKEN>"})
				return
			}
			next.ServeHTTP(w, req)
		})
	})
	r.Get("/v1/clients", s.handle(func(r *http.Request) (any, error) {
		q := r.URL.Query()
		limit, err1 := atoiOr(q.Get("limit"), 0)
		page, err2 := atoiOr(q.Get("page"), 0)
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		return s.Clients(r.Context(), ClientsQuery{Sort: q.Get("sort"), Limit: limit, Page: page})
	}))
	r.Get("/v1/requests/{id}", s.handle(func(r *http.Request) (any, error) {
		return s.Request(r.Context(), chi.URLParam(r, "id"), r.URL.Query().Get("client"))
	}))
	r.Get("/v1/deadletters", s.handle(func(r *http.Request) (any, error) {
		q := r.URL.Query()
		f, err := FilterOf(q.Get("id"), q.Get("client"), q.Get("reason"), q.Get("since"), q.Get("until"), time.Now())
		if err != nil {
			return nil, err
		}
		limit, err := atoiOr(q.Get("limit"), 100)
		if err != nil {
			return nil, err
		}
		list, total, err := s.DeadLetters(r.Context(), f, limit)
		return map[string]any{"total": total, "dead_letters": list}, err
	}))
	r.Post("/v1/replay", s.handle(func(r *http.Request) (any, error) {
		var b struct {
			ID, Client, Reason, Since, Until string
			All                              bool
			DryRun                           bool `json:"dry_run"`
		}
		if err := decode(r, &b); err != nil {
			return nil, err
		}
		f, err := FilterOf(b.ID, b.Client, b.Reason, b.Since, b.Until, time.Now())
		if err != nil {
			return nil, err
		}
		items := []ReplayItem{}
		rep, err := s.Replay(r.Context(), f, b.All, b.DryRun, func(it ReplayItem) {
			if len(items) < 1000 {
				items = append(items, it)
			}
		})
		return map[string]any{"report": rep, "items": items}, err
	}))
	r.Get("/v1/steering", s.handle(func(r *http.Request) (any, error) { return s.Steering(r.Context()) }))
	r.Put("/v1/interval", s.handle(func(r *http.Request) (any, error) {
		var b struct{ Interval string }
		if err := decode(r, &b); err != nil {
			return nil, err
		}
		d, err := parseInterval(b.Interval)
		if err != nil {
			return nil, err
		}
		if err := s.SetInterval(r.Context(), d, by(r)); err != nil {
			return nil, err
		}
		return s.Steering(r.Context())
	}))
	type clientBody struct {
		Client, Interval, Confirm, Wait string
	}
	steer := func(do func(ctx context.Context, b clientBody, by string) (any, error)) http.HandlerFunc {
		return s.handle(func(r *http.Request) (any, error) {
			var b clientBody
			if err := decode(r, &b); err != nil {
				return nil, err
			}
			return do(r.Context(), b, by(r))
		})
	}
	r.Put("/v1/client/interval", steer(func(ctx context.Context, b clientBody, by string) (any, error) {
		d, err := parseInterval(b.Interval)
		if err != nil {
			return nil, err
		}
		return s.SetClientInterval(ctx, b.Client, d, by)
	}))
	r.Post("/v1/client/pause", steer(func(ctx context.Context, b clientBody, by string) (any, error) {
		return s.Pause(ctx, b.Client, by)
	}))
	r.Post("/v1/client/resume", steer(func(ctx context.Context, b clientBody, by string) (any, error) {
		return s.Resume(ctx, b.Client, by)
	}))
	r.Post("/v1/client/purge", steer(func(ctx context.Context, b clientBody, by string) (any, error) {
		wait := time.Duration(0)
		if b.Wait != "" {
			var err error
			if wait, err = time.ParseDuration(b.Wait); err != nil || wait < 0 || wait > maxPurgeWait {
				return nil, invalid("wait %q: a duration from 0s to %s", b.Wait, maxPurgeWait)
			}
		}
		return s.Purge(ctx, b.Client, b.Confirm, by, wait)
	}))
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteProblem(w, httpapi.Problem{Status: http.StatusNotFound, Code: "not_found", Detail: fmt.Sprintf("no admin route %s %s", r.Method, r.URL.Path)})
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteProblem(w, httpapi.Problem{Status: http.StatusMethodNotAllowed, Code: "method_not_allowed", Detail: fmt.Sprintf("%s is not allowed on %s", r.Method, r.URL.Path)})
	})
	return r
}

// maxPurgeWait bounds how long a purge call waits, well within the listener's write
// timeout, so that the answer is never cut off.
const maxPurgeWait = 30 * time.Second

// by names who made a change through the API, for the steering record and the log.
func by(r *http.Request) string { return "admin-api " + r.RemoteAddr }

func (s *Service) handle(fn func(*http.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		out, err := fn(r)
		switch {
		case errors.Is(err, ErrInvalid):
			httpapi.WriteProblem(w, httpapi.Problem{Status: http.StatusBadRequest, Code: "invalid", Detail: err.Error()})
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

func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
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

func parseInterval(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, invalid("interval %q: a duration such as 10s, or 0s to go back to the default", s)
	}
	return d, nil
}

// FilterOf builds a dead-letter filter from text: since and until are RFC 3339 times
// or durations back from now ("2h").
func FilterOf(id, client, reason, since, until string, now time.Time) (queue.DeadFilter, error) {
	f := queue.DeadFilter{ID: id, ClientID: client, Reason: reason}
	var err error
	if f.Since, err = timeOf("since", since, now); err != nil {
		return f, err
	}
	if f.Until, err = timeOf("until", until, now); err != nil {
		return f, err
	}
	return f, nil
}

func timeOf(name, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, invalid("%s %q: an RFC 3339 time (2026-11-30T03:00:00Z) or a duration back from now (2h)", name, s)
}
