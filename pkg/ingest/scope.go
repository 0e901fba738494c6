package ingest

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Scope is what one bearer token may do. A token given in INGEST_TOKEN, or a tokens-file
// line with nothing after its hash, is unscoped: it sends for, and reads, every client,
// as every token did before scopes existed, within shares of its own (the defaults of
// DefaultUnscopedMaxDelayed and DefaultUnscopedMaxBacklogs, its clients with a backlog
// being every client that has one). A line that names a tenant and its clients:
//
//	sha256:<hex> tenant=acme clients=acme-*,partner-7 delayed=1000 backlogs=500 reads=50
//
// gives a token that may send for, and read the requests of, only the clientIds its
// patterns match (403 client_not_allowed for any other; a status read of another's
// request answers as for an unknown id), whose Idempotency-Keys are its tenant's own (the
// same key from another tenant names another request), and which holds at most its
// shares: requests whose Not-Before is still ahead, clients with a backlog, and status
// reads at once. Several lines may name one tenant (a token being rotated): they share
// its scope and its shares.
type Scope struct {
	// Tenant names the tenant; "" for an unscoped token.
	Tenant string
	// Clients are the patterns of the clientIds the token may send for and read: a
	// pattern is a clientId in which "*" stands for any run of characters. Nil: all.
	Clients []string
	// MaxDelayed bounds the tenant's requests whose Not-Before is still ahead, as this
	// ingest instance accepted them (0: DefaultTenantMaxDelayed; unscoped,
	// DefaultUnscopedMaxDelayed).
	MaxDelayed int
	// MaxBacklogs bounds the tenant's clients that have requests queued, across the
	// queue (0: DefaultTenantMaxBacklogs; unscoped, DefaultUnscopedMaxBacklogs).
	MaxBacklogs int
	// MaxReads bounds the tenant's status reads at once on this ingest instance, waiting
	// (?wait) and not each (0: a fair share, MAX_STATUS_WAITS and MAX_STATUS_READS over
	// the number of tenants and unscoped tokens).
	MaxReads int

	key      string // whose shares: the tenant, or the token's hash for an unscoped token
	patterns []*regexp.Regexp
}

// Defaults of a scoped token's shares, and of an unscoped token's. An unscoped token
// sends for every client, so its clients with a backlog are all that have one; it may
// park fewer requests for later than a tenant, since a far Not-Before is how one token
// fills the queue with clients for a day.
const (
	DefaultTenantMaxDelayed    = 10_000
	DefaultTenantMaxBacklogs   = 10_000
	DefaultUnscopedMaxDelayed  = 1_000
	DefaultUnscopedMaxBacklogs = 10_000
)

// maxDelayed and maxBacklogs are the token's shares of delayed requests and of clients
// with a backlog: its line's, or the defaults.
func (s *Scope) maxDelayed() int {
	if s.Scoped() {
		return cmp.Or(s.MaxDelayed, DefaultTenantMaxDelayed)
	}
	return cmp.Or(s.MaxDelayed, DefaultUnscopedMaxDelayed)
}

func (s *Scope) maxBacklogs() int {
	if s.Scoped() {
		return cmp.Or(s.MaxBacklogs, DefaultTenantMaxBacklogs)
	}
	return cmp.Or(s.MaxBacklogs, DefaultUnscopedMaxBacklogs)
}

// who names the token in a refusal of its shares, and how to get a larger one.
func (s *Scope) who() (who, larger string) {
	if s.Scoped() {
		return "tenant " + s.Tenant, "ask for a larger share"
	}
	return "this unscoped token", "give the producer a tenant of its own in INGEST_TOKENS_FILE, with its shares (delayed=, backlogs=)"
}

// readShare is the token's share of status reads at once as its line sets it (reads=);
// 0 for an even share.
func (s *Scope) readShare() int {
	if s == nil {
		return 0
	}
	return s.MaxReads
}

// Scoped says whether the token is limited to some clients.
func (s *Scope) Scoped() bool { return s != nil && s.Tenant != "" }

// Allows says whether the token may send for and read clientID.
func (s *Scope) Allows(clientID string) bool {
	if !s.Scoped() {
		return true
	}
	for _, p := range s.patterns {
		if p.MatchString(clientID) {
			return true
		}
	}
	return false
}

// idFromKey is the id of a request with an Idempotency-Key sent with this token.
func (s *Scope) idFromKey(clientID, key string) string {
	tenant := ""
	if s != nil {
		tenant = s.Tenant
	}
	return request.IDFromKey(tenant, clientID, key)
}

// notAllowed is the refusal of a clientId outside the token's scope.
func (s *Scope) notAllowed(clientID string) *problem {
	return &problem{Status: 403, Code: "client_not_allowed",
		Detail: fmt.Sprintf("this token (tenant %q) may not send for clientId %q: its clients are %s; nothing was stored", s.Tenant, truncate(clientID, 128), strings.Join(s.Clients, ", "))}
}

var tenantName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// parseScope reads the fields after a tokens-file line's hash.
func parseScope(fields []string) (*Scope, error) {
	s := &Scope{}
	seen := map[string]bool{}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok || v == "" {
			return nil, fmt.Errorf("%q is not name=value (tenant=, clients=, delayed=, backlogs=, reads=)", truncate(f, 64))
		}
		if seen[k] {
			return nil, fmt.Errorf("%s= is given twice", truncate(k, 32))
		}
		seen[k] = true
		switch k {
		case "tenant":
			if !tenantName.MatchString(v) {
				return nil, fmt.Errorf("tenant %q: 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit", truncate(v, 64))
			}
			s.Tenant = v
		case "clients":
			for _, p := range strings.Split(v, ",") {
				if err := request.ValidateClientID(strings.ReplaceAll(p, "*", "x")); err != nil || p == "" {
					return nil, fmt.Errorf("clients pattern %q: a clientId, with * for any run of characters", truncate(p, 64))
				}
				s.Clients = append(s.Clients, p)
				s.patterns = append(s.patterns, globPattern(p))
			}
		case "delayed", "backlogs", "reads":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("%s=%q: a whole number, at least 1", k, truncate(v, 32))
			}
			*map[string]*int{"delayed": &s.MaxDelayed, "backlogs": &s.MaxBacklogs, "reads": &s.MaxReads}[k] = n
		default:
			return nil, fmt.Errorf("%q: unknown; a token's line takes tenant=, clients=, delayed=, backlogs= and reads=", truncate(k, 32))
		}
	}
	switch {
	case len(fields) == 0:
		return nil, nil // unscoped
	case s.Tenant == "":
		return nil, fmt.Errorf("a scoped token names its tenant (tenant=...)")
	case len(s.Clients) == 0:
		return nil, fmt.Errorf("tenant %s: name its clients (clients=pattern,...)", s.Tenant)
	}
	s.key = "tenant:" + s.Tenant
	return s, nil
}

// globPattern compiles a clients pattern: "*" is any run of characters, the rest literal.
func globPattern(p string) *regexp.Regexp {
	parts := strings.Split(p, "*")
	for i := range parts {
		parts[i] = regexp.QuoteMeta(parts[i])
	}
	return regexp.MustCompile(`^` + strings.Join(parts, `.*`) + `$`)
}

// sameScope says whether two lines naming one tenant say the same of it: a tenant's
// tokens share one scope, so lines that disagree are a mistake to report.
func sameScope(a, b *Scope) bool {
	return a.Tenant == b.Tenant && slices.Equal(a.Clients, b.Clients) &&
		a.MaxDelayed == b.MaxDelayed && a.MaxBacklogs == b.MaxBacklogs && a.MaxReads == b.MaxReads
}

// shares keeps each tenant's (or unscoped token's) delayed requests; what it holds at
// once (reads, publishes, cancels) each pool keeps.
type shares struct {
	mu      sync.Mutex
	delayed map[string][]time.Time // the Not-Before of each delayed request taken, in no order
}

func newShares() *shares {
	return &shares{delayed: map[string][]time.Time{}}
}

// takeDelayed counts a delayed request for key, if it has room for one more: it is
// counted from before it is stored, so that the items of one batch count each other.
func (sh *shares) takeDelayed(key string, notBefore time.Time, limit int, now time.Time) bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ts := sh.delayed[key]
	kept := ts[:0]
	for _, t := range ts {
		if t.After(now) {
			kept = append(kept, t)
		}
	}
	if len(kept) >= limit {
		sh.delayed[key] = kept
		return false
	}
	sh.delayed[key] = append(kept, notBefore)
	return true
}

// releaseDelayed uncounts a delayed request that was not stored after all (or was a
// copy of one stored before).
func (sh *shares) releaseDelayed(key string, notBefore time.Time) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ts := sh.delayed[key]
	for i, t := range ts {
		if t.Equal(notBefore) {
			ts[i] = ts[len(ts)-1]
			sh.delayed[key] = ts[:len(ts)-1]
			break
		}
	}
	if len(sh.delayed[key]) == 0 {
		delete(sh.delayed, key)
	}
}

// BacklogLister lists the request subjects that have requests queued, with their counts
// (queue.Queue does).
type BacklogLister interface {
	Backlog(ctx context.Context) (map[string]uint64, error)
}

// backlogs knows which clients have requests queued, as listed at most every seconds ago
// and with those that ingest took a request for since: a scoped token's clients with a
// backlog are counted against its share from it. Across ingest instances the count is
// the queue's (listed), give or take what others took since the last listing.
type backlogs struct {
	list  BacklogLister
	every time.Duration

	mu         sync.Mutex
	at         time.Time           // of the last listing; zero: never
	refreshing bool                // a listing is under way
	clients    map[string]struct{} // clientIds with a backlog
	counts     map[string]int      // of a scope's key: its clients in clients
}

// admit says whether s may send for clientID: it has a backlog already, or s's tenant has
// fewer clients with a backlog than limit. An admitted client counts as having one from
// now. When the queue cannot be listed, the last listing stands (or none: all admitted).
func (b *backlogs) admit(ctx context.Context, s *Scope, clientID string, limit int) bool {
	b.refresh(ctx)
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.clients[clientID]; ok {
		return true
	}
	n, ok := b.counts[s.key]
	switch {
	case ok:
	case !s.Scoped():
		n = len(b.clients) // its clients are all
	default:
		for c := range b.clients {
			if s.Allows(c) {
				n++
			}
		}
	}
	if n >= limit {
		b.counts[s.key] = n
		return false
	}
	b.clients[clientID] = struct{}{}
	b.counts[s.key] = n + 1
	return true
}

// refresh lists the queue again when the last listing is older than every, unless
// another caller is at it (this one then goes on with the last).
func (b *backlogs) refresh(ctx context.Context) {
	b.mu.Lock()
	if b.refreshing || (!b.at.IsZero() && time.Since(b.at) < b.every) {
		b.mu.Unlock()
		return
	}
	b.refreshing = true
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, statusReadTimeout)
	subjects, err := b.list.Backlog(ctx)
	cancel()
	clients := make(map[string]struct{}, len(subjects))
	for subject, n := range subjects {
		if c, err := request.ClientIDOf(subject); err == nil && n > 0 {
			clients[c] = struct{}{}
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refreshing, b.at = false, time.Now()
	if err != nil {
		return // the last listing stands until the next is due
	}
	b.clients, b.counts = clients, map[string]int{}
}

func newBacklogs(list BacklogLister, every time.Duration) *backlogs {
	return &backlogs{list: list, every: every, clients: map[string]struct{}{}, counts: map[string]int{}}
}

// admit checks what the token's scope says of req before it is stored: its client, and
// the token's shares of clients with a backlog and of delayed requests. What it counts
// for req, unadmit uncounts when req is not stored after all (or was a copy).
func (a *API) admit(ctx context.Context, s *Scope, req request.Request) *problem {
	if s == nil {
		return nil // nothing to count: ingest takes requests without tokens
	}
	if !s.Allows(req.ClientID) {
		return s.notAllowed(req.ClientID)
	}
	who, larger := s.who()
	if a.backlogs != nil {
		limit := s.maxBacklogs()
		if !a.backlogs.admit(ctx, s, req.ClientID, limit) {
			return &problem{Status: http.StatusTooManyRequests, Code: "tenant_backlogs_full", RetryAfter: a.cfg.BacklogRetryAfter,
				Detail: fmt.Sprintf("%s has requests queued for %d clients already, its share (backlogs=); clientId %q has none and was not given one: retry once one of the others has been sent, or %s", who, limit, truncate(req.ClientID, 128), larger)}
		}
	}
	if now := time.Now(); req.NotBefore.After(now) {
		limit := s.maxDelayed()
		if !a.shares.takeDelayed(s.key, req.NotBefore, limit, now) {
			return &problem{Status: http.StatusTooManyRequests, Code: "tenant_delayed_full", RetryAfter: a.cfg.BacklogRetryAfter,
				Detail: fmt.Sprintf("%s has %d requests waiting for their Not-Before already on this ingest, its share (delayed=); this one was not stored: send it when it is due, or once some of the others are, or %s", who, limit, larger)}
		}
	}
	return nil
}

// unadmit uncounts what admit counted for a request that was not stored (or that was a
// copy of one stored before).
func (a *API) unadmit(s *Scope, req request.Request) {
	if s != nil && !req.NotBefore.IsZero() {
		a.shares.releaseDelayed(s.key, req.NotBefore)
	}
}

// reusedKey is the refusal of a request whose Idempotency-Key named a request stored
// before with another body.
type reusedKey struct {
	id    string
	first time.Time
}

func (e *reusedKey) Error() string {
	return fmt.Sprintf("this Idempotency-Key was sent before with another body (request %s, accepted %s); this request was not stored and the first stands: a new request needs a new key",
		e.id, e.first.UTC().Format(time.RFC3339))
}

// sameBody checks that req, which the queue took for a copy of request seq stored
// before, has that request's body: as the queued request's headers say (its
// Request.BodyDigest, which the dispatchers' lookup answers) while it is queued, else as
// its final event says (a keyed request's final events carry its digest, ADR 18: a final
// event is stored before its request leaves the queue). When neither can be read
// (status off, no dispatcher answering, the request's events expired) the copy is taken
// as the queue took it.
func (a *API) sameBody(ctx context.Context, s *Scope, req request.Request, seq uint64) error {
	digest := req.BodyDigest
	if a.cfg.Status == nil || digest == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, statusReadTimeout)
	defer cancel()
	if f, ok, _ := a.askQueued(ctx, s, req.ClientID, req.ID); ok {
		if f.BodyDigest != "" && f.BodyDigest != digest {
			return &reusedKey{id: req.ID, first: f.AcceptedAt}
		}
		return nil
	}
	events, err := a.cfg.Status.StatusEvents(ctx, req.ClientID, req.ID)
	if err != nil {
		return nil
	}
	for _, e := range events {
		if e.BodyDigest == "" || e.Seq != 0 && seq != 0 && e.Seq != seq {
			continue // not the copy the queue took it for
		}
		if e.BodyDigest != digest {
			return &reusedKey{id: req.ID, first: e.AcceptedAt}
		}
	}
	return nil
}
