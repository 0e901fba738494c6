// Package console is the operators' web console: server-rendered pages over the admin
// Service (the same calls the admin API makes; it adds no second way to steer), served
// under /console/ by the dispatcher's operators' listener from files embedded in the
// binary.
//
// Access needs ADMIN_TOKEN: a sign-in form sets a session cookie (HttpOnly,
// SameSite=Strict, Secure when served over TLS) that is a random nonce and an expiry with
// their HMAC under a key derived from the token with scrypt, so every instance sharing
// the token accepts it, changing the token signs everyone out, and a stolen cookie costs
// an scrypt per guess of the token. Signing out removes the cookie from the browser; the
// session it held stays valid until it expires (no instance keeps sessions). Wrong tokens
// are throttled, per address and all together; the right one is never held back. Every
// action is a POST carrying a token derived from the session (and refused cross-origin
// by net/http's CrossOriginProtection); every answer carries a strict
// Content-Security-Policy; templates escape every value.
package console

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/crypto/scrypt"

	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/httpapi"
)

//go:embed templates/*.html static/*
var files embed.FS

// Config is what a Console works with.
type Config struct {
	// Admin is what every page reads through and every action goes to; required.
	Admin *admin.Service
	// Token is ADMIN_TOKEN: the console is off (says so, and shows nothing) when empty.
	Token string
	// TLS says the listener serves TLS: the session cookie is then Secure.
	TLS bool
	// Log hears of sign-ins refused.
	Log zerolog.Logger
	// Session is how long a sign-in lasts; defaults to 12 hours.
	Session time.Duration
	// Refresh is how often pages refresh themselves; defaults to 5 s.
	Refresh time.Duration
}

// Console serves the pages.
type Console struct {
	cfg      Config
	key      []byte
	tokenSum [sha256.Size]byte // compared by digest: equal lengths, whatever was typed
	refusals *httpapi.Throttle // wrong tokens
	pages    map[string]*template.Template
	now      func() time.Time
	cop      *http.CrossOriginProtection
}

const (
	cookieName = "console_session"
	// Prefix is where the console is served.
	Prefix = "/console/"
)

// New returns a Console for cfg.
func New(cfg Config) (*Console, error) {
	if cfg.Admin == nil {
		return nil, errors.New("console: the admin service is required")
	}
	if cfg.Session == 0 {
		cfg.Session = 12 * time.Hour
	}
	if cfg.Refresh == 0 {
		cfg.Refresh = 5 * time.Second
	}
	key, err := sessionKey(cfg.Token)
	if err != nil {
		return nil, err
	}
	tokenSum := sha256.Sum256([]byte(cfg.Token))
	c := &Console{cfg: cfg, key: key, tokenSum: tokenSum, now: time.Now, cop: http.NewCrossOriginProtection(), refusals: httpapi.NewThrottle(httpapi.ThrottleConfig{})}
	if c.pages, err = parsePages(); err != nil {
		return nil, err
	}
	return c, nil
}

// keys holds the session key derived from each token seen: deriving one costs about
// 100 ms of CPU and 32 MB on purpose, so it is done once per token, not per Console.
var keys sync.Map // token -> []byte

// sessionKey derives the key that signs sessions from the token, with scrypt and the same
// salt everywhere, so that every instance given the token derives the same key. No token:
// no console, no key.
func sessionKey(token string) ([]byte, error) {
	if token == "" {
		return nil, nil
	}
	if k, ok := keys.Load(token); ok {
		return k.([]byte), nil
	}
	k, err := scrypt.Key([]byte(token), []byte("dispatcher console session key"), 1<<15, 8, 1, 32)
	if err != nil {
		return nil, fmt.Errorf("console: deriving the session key: %w", err)
	}
	keys.Store(token, k)
	return k, nil
}

// Handler serves the console's paths, which all begin with Prefix.
func (c *Console) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(files, "static")
	mux.Handle("GET "+Prefix+"static/", http.StripPrefix(Prefix+"static/", http.FileServerFS(static)))
	mux.HandleFunc("GET "+Prefix+"signin", c.signinPage)
	mux.HandleFunc("POST "+Prefix+"signin", c.signin)
	mux.HandleFunc("POST "+Prefix+"signout", c.action(c.signout))
	mux.HandleFunc("GET "+Prefix+"{$}", c.page(c.overview))
	mux.HandleFunc("GET "+Prefix+"clients", c.page(c.clients))
	mux.HandleFunc("GET "+Prefix+"client", c.page(c.client))
	mux.HandleFunc("GET "+Prefix+"client/purge", c.page(c.purgePage))
	mux.HandleFunc("POST "+Prefix+"client/pause", c.action(c.pause))
	mux.HandleFunc("POST "+Prefix+"client/resume", c.action(c.resume))
	mux.HandleFunc("POST "+Prefix+"client/interval", c.action(c.setClientInterval))
	mux.HandleFunc("POST "+Prefix+"client/purge", c.action(c.purge))
	mux.HandleFunc("GET "+Prefix+"deadletters", c.page(c.deadLetters))
	mux.HandleFunc("POST "+Prefix+"deadletters/replay", c.action(c.replay))
	mux.HandleFunc("GET "+Prefix+"request", c.page(c.request))
	mux.HandleFunc("POST "+Prefix+"request/cancel", c.action(c.cancel))
	mux.HandleFunc("GET "+Prefix+"steering", c.page(c.steering))
	mux.HandleFunc("POST "+Prefix+"steering/interval", c.action(c.setInterval))
	mux.HandleFunc(Prefix, func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, http.StatusNotFound, "No such page: "+r.URL.Path)
	})
	return httpapi.SecurityHeaders(ContentSecurityPolicy)(mux)
}

// ContentSecurityPolicy is the policy of every answer: the console's own script and
// style only, no inline script or style, no frames, forms posted to the console only.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// sign is the HMAC of what under the console's key, in hex.
func (c *Console) sign(what string) string {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte(what))
	return hex.EncodeToString(m.Sum(nil))
}

// session returns the request's session cookie value when it is valid and unexpired.
func (c *Console) session(r *http.Request) (string, bool) {
	if c.cfg.Token == "" {
		return "", false
	}
	ck, err := r.Cookie(cookieName)
	if err != nil {
		return "", false
	}
	claim, mac, ok := strings.Cut(ck.Value, ".")
	if !ok {
		return "", false
	}
	_, exp, ok := strings.Cut(claim, "-")
	if !ok {
		return "", false
	}
	unix, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || c.now().Unix() >= unix {
		return "", false
	}
	if !hmac.Equal([]byte(mac), []byte(c.sign("session\x00"+claim))) {
		return "", false
	}
	return ck.Value, true
}

// csrf is the token every form of session carries.
func (c *Console) csrf(session string) string { return c.sign("csrf\x00" + session)[:32] }

func (c *Console) signinPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "signin", view{Title: "Sign in", Data: signinData{Off: c.cfg.Token == "", Next: safeNext(r.URL.Query().Get("next"))}})
}

type signinData struct {
	Off       bool
	Refused   bool
	Throttled int  // seconds to wait before the next try; 0: not throttled
	Everyone  bool // throttled by the wrong tries of all addresses together
	Next      string
}

func (c *Console) signin(w http.ResponseWriter, r *http.Request) {
	if err := c.cop.Check(r); err != nil {
		c.fail(w, r, http.StatusForbidden, "Refused: a cross-origin sign-in.")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	token := r.PostFormValue("token")
	next := safeNext(r.PostFormValue("next"))
	typed := sha256.Sum256([]byte(token))
	if c.cfg.Token == "" || subtle.ConstantTimeCompare(typed[:], c.tokenSum[:]) != 1 {
		c.refused(w, r, next)
		return
	}
	nonce := make([]byte, 16)
	_, _ = rand.Read(nonce) // never fails (crypto/rand)
	claim := hex.EncodeToString(nonce) + "-" + strconv.FormatInt(c.now().Add(c.cfg.Session).Unix(), 10)
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: claim + "." + c.sign("session\x00"+claim), Path: Prefix,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: c.cfg.TLS, MaxAge: int(c.cfg.Session / time.Second)})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// refused answers a wrong token: 401, or 429 with Retry-After past the throttle's bounds.
func (c *Console) refused(w http.ResponseWriter, r *http.Request, next string) {
	if wait, everyone := c.refusals.Wrong(httpapi.ThrottleKey(r), c.now()); wait > 0 {
		secs := int(wait.Seconds() + 1)
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		c.cfg.Log.Warn().Str("remote", r.RemoteAddr).Bool("everyone", everyone).Msg("console sign-in throttled: too many wrong tokens")
		c.render(w, r, http.StatusTooManyRequests, "signin", view{Title: "Sign in", Data: signinData{Off: c.cfg.Token == "", Throttled: secs, Everyone: everyone, Next: next}})
		return
	}
	c.cfg.Log.Warn().Str("remote", r.RemoteAddr).Msg("console sign-in refused")
	c.render(w, r, http.StatusUnauthorized, "signin", view{Title: "Sign in", Data: signinData{Off: c.cfg.Token == "", Refused: true, Next: next}})
}

// safeNext keeps a return address within the console.
func safeNext(next string) string {
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.Opaque != "" || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return Prefix
	}
	// Dot segments (written or %2e-encoded, which browsers resolve alike) could lead out.
	p := path.Clean(u.Path)
	if strings.HasSuffix(u.Path, "/") && p != "/" {
		p += "/"
	}
	if !strings.HasPrefix(p, Prefix) {
		return Prefix
	}
	return (&url.URL{Path: p, RawQuery: u.RawQuery}).String()
}

func (c *Console) signout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: Prefix, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: c.cfg.TLS, MaxAge: -1})
	http.Redirect(w, r, Prefix+"signin", http.StatusSeeOther)
}

// view is what every page's template gets.
type view struct {
	Title   string // before " · Dispatcher console"
	Nav     string // the menu entry to mark
	CSRF    string
	Refresh int // seconds; 0: the page does not refresh itself
	Flash   string
	Now     time.Time
	Data    any
}

// page wraps a page: signed in, or sent to sign in.
func (c *Console) page(fn func(r *http.Request, v *view) (string, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sess, ok := c.session(r)
		if !ok {
			http.Redirect(w, r, Prefix+"signin?next="+urlQueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		if err := httpapi.CheckQuery(r); err != nil {
			c.fail(w, r, http.StatusBadRequest, err.Error())
			return
		}
		v := view{CSRF: c.csrf(sess), Now: c.now(), Flash: flashText(r.URL.Query())}
		name, err := fn(r, &v)
		if err != nil {
			c.fail(w, r, statusOf(err), err.Error())
			return
		}
		c.render(w, r, http.StatusOK, name, v)
	}
}

// action wraps a POST: signed in, same origin, carrying the session's CSRF token.
func (c *Console) action(fn func(w http.ResponseWriter, r *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sess, ok := c.session(r)
		if !ok {
			c.fail(w, r, http.StatusUnauthorized, "Not signed in, or the session has expired: sign in again.")
			return
		}
		if err := c.cop.Check(r); err != nil {
			c.fail(w, r, http.StatusForbidden, "Refused: a cross-origin request.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
		if err := r.ParseForm(); err != nil {
			c.fail(w, r, http.StatusBadRequest, "The form could not be read: "+err.Error())
			return
		}
		if got := r.PostForm.Get("csrf"); subtle.ConstantTimeCompare([]byte(got), []byte(c.csrf(sess))) != 1 {
			c.fail(w, r, http.StatusForbidden, "Refused: the form's CSRF token is missing or wrong. Reload the page and try again.")
			return
		}
		fn(w, r)
	}
}

// errStatus carries the HTTP status a page's error is shown with.
type errStatus struct {
	status int
	err    error
}

func (e errStatus) Error() string { return e.err.Error() }
func (e errStatus) Unwrap() error { return e.err }

func statusOf(err error) int {
	var es errStatus
	switch {
	case errors.As(err, &es):
		return es.status
	case errors.Is(err, admin.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, admin.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, admin.ErrNotFound):
		return http.StatusNotFound
	default:
		return http.StatusServiceUnavailable
	}
}

func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, detail string) {
	v := view{Title: http.StatusText(status), Now: c.now(), Data: errorData{Status: status, Detail: detail}}
	if sess, ok := c.session(r); ok {
		v.CSRF = c.csrf(sess)
	}
	c.render(w, r, status, "error", v)
}

type errorData struct {
	Status int
	Detail string
}

// render executes the page into a buffer first, so that a template error is a clean 500.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, v view) {
	t := c.pages[name]
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", v); err != nil {
		c.cfg.Log.Error().Err(err).Str("page", name).Msg("console page failed to render")
		http.Error(w, fmt.Sprintf("the page %s could not be rendered; the log says why", name), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w)
}

func parsePages() (map[string]*template.Template, error) {
	layout, err := files.ReadFile("templates/layout.html")
	if err != nil {
		return nil, err
	}
	names, err := fs.Glob(files, "templates/*.html")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, n := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if name == "layout" {
			continue
		}
		body, err := files.ReadFile(n)
		if err != nil {
			return nil, err
		}
		t, err := template.New(name).Funcs(funcs).Parse(string(layout))
		if err == nil {
			_, err = t.Parse(string(body))
		}
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}
