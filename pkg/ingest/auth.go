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
	fixed [][sha256.Size]byte

	mu      sync.RWMutex
	hashes  [][sha256.Size]byte
	content [sha256.Size]byte // of the file as last read
}

// NewTokens reads the hashes in file (if not empty) and adds the plain tokens given. It
// fails if the file cannot be read or holds a line that is not a hash, or if no token
// results.
func NewTokens(file string, plain []string) (*Tokens, error) {
	t := &Tokens{file: file}
	for _, p := range plain {
		if p = strings.TrimSpace(p); p != "" {
			t.fixed = append(t.fixed, sha256.Sum256([]byte(p)))
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
	return len(t.hashes)
}

// Reload reads the file again. On an error, or a file that leaves no token at all (a
// half-written file, say), the tokens in force stay as they were.
func (t *Tokens) Reload() error {
	hashes := append([][sha256.Size]byte(nil), t.fixed...)
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
			hashes = append(hashes, [sha256.Size]byte(b))
		}
		if err := sc.Err(); err != nil {
			return fmt.Errorf("tokens file: %w", err)
		}
		if len(hashes) == len(t.fixed) {
			return fmt.Errorf("tokens file %s holds no token (half written?)", t.file)
		}
	}
	if len(hashes) == 0 {
		return errors.New("no token given")
	}
	t.mu.Lock()
	t.hashes, t.content = hashes, content
	t.mu.Unlock()
	return nil
}

// Valid says whether token is one of the tokens. It compares the token's hash with every
// hash in constant time, so the time taken says nothing about which, if any, matched.
func (t *Tokens) Valid(token string) bool {
	sum := sha256.Sum256([]byte(token))
	t.mu.RLock()
	defer t.mu.RUnlock()
	ok := 0
	for i := range t.hashes {
		ok |= subtle.ConstantTimeCompare(sum[:], t.hashes[i][:])
	}
	return ok == 1 && token != ""
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
// case: "bearer" is Bearer). The answer never says why a token was refused.
func (a *API) authorize(next http.Handler) http.Handler {
	if a.cfg.Tokens == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := httpapi.BearerToken(r)
		if !ok || !a.cfg.Tokens.Valid(token) {
			a.cfg.Metrics.outcome("unauthorized")
			w.Header().Set("WWW-Authenticate", `Bearer realm="ingest"`)
			writeProblem(w, problem{Status: http.StatusUnauthorized, Code: "unauthorized",
				Detail: "a valid bearer token is required: send Authorization: Bearer <token>"})
			return
		}
		next.ServeHTTP(w, r)
	})
}
