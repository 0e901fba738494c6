package ingest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/httpapi"
)

// Tokens is the set of bearer tokens ingest accepts, kept as SHA-256 hashes: from a file
// of hashes (one "sha256:<hex>" per line, re-read when it changes, so tokens rotate
// without a restart) and from tokens given directly. Safe for concurrent use.
type Tokens struct {
	file  string
	fixed []token

	mu      sync.RWMutex
	tokens  []token
	keys    int               // distinct share keys: tenants, and unscoped tokens
	tenants int               // tokens scoped to a tenant
	content [sha256.Size]byte // of the file as last read
}

// token is one token's hash and what it may do.
type token struct {
	hash  [sha256.Size]byte
	scope *Scope
}

// unscoped is the scope of a token that may send for every client: its shares are its own.
func unscoped(hash [sha256.Size]byte) *Scope {
	return &Scope{key: "token:" + hex.EncodeToString(hash[:8])}
}

// NewTokens reads the hashes in file (if not empty), each with its scope if the line
// gives one (see Scope), and adds the plain tokens given, unscoped. It fails if the file
// cannot be read or holds a line that is not a hash and a scope, or if no token results.
func NewTokens(file string, plain []string) (*Tokens, error) {
	t := &Tokens{file: file}
	for _, p := range plain {
		if p = strings.TrimSpace(p); p != "" {
			h := sha256.Sum256([]byte(p))
			t.fixed = append(t.fixed, token{h, unscoped(h)})
		}
	}
	if err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *Tokens) count() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.tokens)
}

// Reload reads the file again. On an error, or a file that leaves no token at all (a
// half-written file, say), the tokens in force stay as they were.
func (t *Tokens) Reload() error {
	tokens := append([]token(nil), t.fixed...)
	tenants := map[string]*Scope{}
	var content [sha256.Size]byte
	if t.file != "" {
		raw, err := os.ReadFile(t.file)
		if err != nil {
			return fmt.Errorf("tokens file: %w", err)
		}
		content = sha256.Sum256(raw)
		sc := bufio.NewScanner(bytes.NewReader(raw))
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			if i := strings.IndexByte(line, '#'); i >= 0 {
				line = line[:i]
			}
			fields := strings.Fields(line)
			if len(fields) == 0 {
				continue
			}
			h, ok := strings.CutPrefix(fields[0], "sha256:")
			b, err := hex.DecodeString(h)
			if !ok || err != nil || len(b) != sha256.Size {
				// The line is not repeated: it might be a token pasted by mistake.
				return fmt.Errorf(`tokens file %s, line %d: not "sha256:" and the hex SHA-256 of a token (make one with: printf 'sha256:%%s\n' "$(printf %%s "$TOKEN" | sha256sum | cut -d' ' -f1)")`, t.file, n)
			}
			scope, err := parseScope(fields[1:])
			if err != nil {
				return fmt.Errorf("tokens file %s, line %d: %w", t.file, n, err)
			}
			switch {
			case scope == nil:
				scope = unscoped([sha256.Size]byte(b))
			case tenants[scope.Tenant] == nil:
				tenants[scope.Tenant] = scope
			case !sameScope(tenants[scope.Tenant], scope):
				return fmt.Errorf("tokens file %s, line %d: tenant %s is given another scope on an earlier line; a tenant's tokens share one", t.file, n, scope.Tenant)
			default:
				scope = tenants[scope.Tenant] // one scope, so one share, per tenant
			}
			tokens = append(tokens, token{[sha256.Size]byte(b), scope})
		}
		if err := sc.Err(); err != nil {
			return fmt.Errorf("tokens file: %w", err)
		}
		if len(tokens) == len(t.fixed) {
			return fmt.Errorf("tokens file %s holds no token (half written?)", t.file)
		}
	}
	if len(tokens) == 0 {
		return errors.New("no token given")
	}
	keys, scoped := map[string]bool{}, 0
	for _, tk := range tokens {
		keys[tk.scope.key] = true
		if tk.scope.Scoped() {
			scoped++
		}
	}
	t.mu.Lock()
	t.tokens, t.keys, t.tenants, t.content = tokens, len(keys), scoped, content
	t.mu.Unlock()
	return nil
}

// shareKeys is how many tenants and unscoped tokens there are: what ingest holds for
// them at once (status reads) is shared among this many.
func (t *Tokens) shareKeys() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.keys
}

// Unscoped says whether every token is unscoped: each may send for, and read, every
// client.
func (t *Tokens) Unscoped() bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.tenants == 0
}

// Valid says whether tok is one of the tokens, and what it may do. It compares the token's
// hash with every hash in constant time, so the time taken says nothing about which, if
// any, matched.
func (t *Tokens) Valid(tok string) (*Scope, bool) {
	sum := sha256.Sum256([]byte(tok))
	t.mu.RLock()
	defer t.mu.RUnlock()
	var scope *Scope
	for i := range t.tokens {
		if subtle.ConstantTimeCompare(sum[:], t.tokens[i].hash[:]) == 1 {
			scope = t.tokens[i].scope
		}
	}
	return scope, scope != nil && tok != ""
}

// Watch re-reads the file whenever it changes, checking every interval, until ctx ends.
func (t *Tokens) Watch(ctx context.Context, every time.Duration, log zerolog.Logger) {
	if t.file == "" {
		return
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		raw, err := os.ReadFile(t.file)
		if err != nil {
			log.Warn().Err(err).Msg("tokens file unreadable; keeping the tokens in force")
			continue
		}
		t.mu.RLock()
		same := sha256.Sum256(raw) == t.content
		t.mu.RUnlock()
		if same {
			continue
		}
		if err := t.Reload(); err != nil {
			log.Error().Err(err).Msg("tokens file changed but cannot be used; keeping the tokens in force")
			continue
		}
		log.Info().Int("tokens", t.count()).Msg("tokens file reloaded")
	}
}

// authorize refuses requests without a valid bearer token (the scheme's name in any
// case: "bearer" is Bearer), and hands next the token's scope: nil when ingest takes
// requests without tokens. The answer never says why a token was refused.
func (a *API) authorize(next func(http.ResponseWriter, *http.Request, *Scope)) http.Handler {
	if a.cfg.Tokens == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { next(w, r, nil) })
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := httpapi.BearerToken(r)
		var scope *Scope
		if ok {
			scope, ok = a.cfg.Tokens.Valid(tok)
		}
		if !ok {
			a.cfg.Metrics.outcome("unauthorized")
			w.Header().Set("WWW-Authenticate", `Bearer realm="ingest"`)
			writeProblem(w, problem{Status: http.StatusUnauthorized, Code: "unauthorized",
				Detail: "a valid bearer token is required: send Authorization: Bearer <token>"})
			return
		}
		next(w, r, scope)
	})
}
