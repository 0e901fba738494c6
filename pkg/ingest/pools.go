package ingest

import (
	"fmt"
	"net/http"
	"sync"
	"time"
)

// pool is one of the bounded things ingest holds for the calls it serves at once:
// publishes waiting for JetStream, the bytes of batches being read and stored, status
// reads (waiting and not), asks whether a request is queued, cancels being decided. All
// of it is bounded by size; with tokens, each tenant or unscoped token holds at most its
// share of it as well (API.share), so that one cannot leave the others none.
type pool struct {
	size  int64
	least int64  // the smallest share: 1, or a batch's bytes at their largest
	code  string // the refusal of a token past its share
	what  string // what the pool counts, as a refusal names it: "status reads waiting"
	bound string // what bounds it: its setting, or "ingest's bound of 16"

	mu   sync.Mutex
	used int64
	held map[string]int64 // of a share key: what it holds now
}

func newPool(size, least int64, code, what, bound string) *pool {
	return &pool{size: size, least: least, code: code, what: what, bound: bound, held: map[string]int64{}}
}

// takeUpTo takes up to n of p for key, which may hold at most share ("": not counted by
// share), and says how much it took; overShare says that key's share, not the pool's
// size, stopped it short of n. Both are checked in one step: a token past its share is
// refused without taking, even for a moment, what the others may need.
func (p *pool) takeUpTo(key string, share, n int64) (took int64, overShare bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.takeLocked(key, share, n, true)
}

// takeAll takes n of p for key within share, or nothing: ok, or the reason it did not
// (overShare: key's share; else p's size).
func (p *pool) takeAll(key string, share, n int64) (ok, overShare bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	took, over := p.takeLocked(key, share, n, false)
	return took == n, over
}

func (p *pool) takeLocked(key string, share, n int64, partial bool) (took int64, overShare bool) {
	took = min(n, p.size-p.used)
	if mine := share - p.held[key]; key != "" && mine < n && mine <= took {
		took, overShare = max(mine, 0), true
	}
	if took <= 0 || (took < n && !partial) {
		return 0, overShare
	}
	p.used += took
	if key != "" {
		p.held[key] += took
	}
	return took, overShare
}

// give gives back n of p that key took.
func (p *pool) give(key string, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.used -= n
	if key == "" {
		return
	}
	if p.held[key] -= n; p.held[key] <= 0 {
		delete(p.held, key)
	}
}

// share is what of p the token (scope) may hold at once, and the key it is counted by:
// set when the token's line gives it (reads=), else an even share of p among the tenants
// and unscoped tokens, never less than p.least. Key "" when nothing is counted by share:
// ingest without tokens, or a share that is all of p (one token: p's bound is its bound).
func (a *API) share(scope *Scope, p *pool, set int) (key string, limit int64) {
	if scope == nil {
		return "", p.size
	}
	limit = int64(set)
	if limit == 0 {
		limit = max(fairShare(p.size, int64(a.cfg.Tokens.shareKeys())), p.least)
	}
	if limit >= p.size {
		return "", p.size
	}
	return scope.key, limit
}

// fairShare is size over n keys, rounded down, so that the shares of n keys fit in size
// together; at least 1.
func fairShare(size, n int64) int64 {
	return max(1, size/max(n, 1))
}

// overShare is the refusal of a call whose token holds its share of p (limit) already.
func (p *pool) overShare(limit int64, set bool) problem {
	how := "an even share among the tenants and unscoped tokens of the tokens file"
	if set {
		how = "reads= in the tokens file"
	}
	return problem{Status: http.StatusTooManyRequests, Code: p.code, RetryAfter: time.Second,
		Detail: fmt.Sprintf("this token holds %d %s at once already, its share of %s (%s); retry after the Retry-After delay", limit, p.what, p.bound, how)}
}

// takeSlot takes one of p for the token (scope), within its share (set: the token's own,
// 0 for an even share). It returns what gives it back; or the refusal: 429 p.code past
// the share, ok false with no problem when p is full (the caller says so as it must).
func (a *API) takeSlot(scope *Scope, p *pool, set int) (release func(), refusal *problem, ok bool) {
	key, limit := a.share(scope, p, set)
	taken, over := p.takeAll(key, limit, 1)
	switch {
	case taken:
		return func() { p.give(key, 1) }, nil, true
	case over:
		r := p.overShare(limit, set > 0)
		return nil, &r, false
	}
	return nil, nil, false
}
