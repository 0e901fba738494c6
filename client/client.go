package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

const (
	// DefaultTimeout is the whole-exchange timeout of the http.Client that New makes
	// when WithHTTPClient is not given. It outlasts the longest long poll Wait asks
	// for (MaxWaitPoll) with room to spare.
	DefaultTimeout = 90 * time.Second

	// DefaultMaxBatchItems is how many items SubmitBatch puts in one request unless
	// WithMaxBatchItems says otherwise.
	DefaultMaxBatchItems = 1000

	// MaxWaitPoll is the longest single long poll Wait asks ingest for.
	MaxWaitPoll = 30 * time.Second

	// maxAnswerBytes caps how much of one answer is read: a batch answer of
	// DefaultMaxBatchItems results is a few hundred kilobytes.
	maxAnswerBytes = 8 << 20

	// userAgent names this client in ingest's logs.
	userAgent = "penguinhq-dispatcher-client/1"
)

// Client talks to one ingest. It is safe for concurrent use by many goroutines.
type Client struct {
	baseURL       string // without a trailing slash
	http          *http.Client
	token         string
	retry         RetryPolicy
	maxBatchItems int
}

// Option changes how New builds a Client.
type Option func(*Client) error

// WithToken makes every call send "Authorization: Bearer <token>".
func WithToken(token string) Option {
	return func(c *Client) error {
		if token == "" {
			return errors.New("WithToken: the token is empty; leave the option out to send none")
		}
		c.token = token
		return nil
	}
}

// WithHTTPClient makes calls go through hc instead of a client with DefaultTimeout.
// If hc has a Timeout, Wait asks for long polls of at most half of it, so that a long
// poll is answered before hc gives up on it.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) error {
		if hc == nil {
			return errors.New("WithHTTPClient: the client is nil; leave the option out for the default one")
		}
		c.http = hc
		return nil
	}
}

// WithRetry replaces the default RetryPolicy; its zero fields take their defaults.
func WithRetry(p RetryPolicy) Option {
	return func(c *Client) error {
		policy := p.withDefaults() // not p itself: an Option may be used by many New at once
		if err := policy.validate(); err != nil {
			return fmt.Errorf("WithRetry: %w", err)
		}
		c.retry = policy
		return nil
	}
}

// WithMaxBatchItems sets how many items SubmitBatch puts in one request; larger
// batches are split. Keep it at or below ingest's own batch limit. Defaults to
// DefaultMaxBatchItems.
func WithMaxBatchItems(n int) Option {
	return func(c *Client) error {
		if n < 1 {
			return fmt.Errorf("WithMaxBatchItems: %d is not a number of items; give 1 or more", n)
		}
		c.maxBatchItems = n
		return nil
	}
}

// New returns a Client for the ingest at baseURL, an absolute http or https URL such
// as "https://ingest.example" or "http://localhost:8080/prefix".
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("client: parsing the base URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("client: base URL %q is not an absolute http or https URL", baseURL)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("client: base URL %q has no host", baseURL)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("client: base URL %q has a query or fragment; give only scheme, host and path", baseURL)
	}
	c := &Client{
		baseURL:       strings.TrimSuffix(u.String(), "/"),
		http:          &http.Client{Timeout: DefaultTimeout},
		retry:         RetryPolicy{}.withDefaults(),
		maxBatchItems: DefaultMaxBatchItems,
	}
	for _, opt := range opts {
		if err := opt(c); err != nil {
			return nil, fmt.Errorf("client: %w", err)
		}
	}
	return c, nil
}

// outcome is what one exchange with ingest came to: err is nil on success; retry says
// whether sending the same request again may succeed; retryAfter is how long ingest
// asked to wait first.
type outcome struct {
	err        error
	retry      bool
	retryAfter time.Duration
}

// exchange sends one request to ingest and returns the body of a 2xx answer. Any
// other answer comes back as a *Problem in the outcome.
func (c *Client) exchange(ctx context.Context, method, path string, header http.Header, body []byte) ([]byte, outcome) {
	var reader io.Reader = http.NoBody
	if body != nil {
		reader = bytes.NewReader(body) // lets the transport resend it too
	}
	req, err := http.NewRequestWithContext(ctx, method, c.baseURL+path, reader)
	if err != nil {
		return nil, outcome{err: fmt.Errorf("building the request: %w", err)}
	}
	for name, values := range header {
		req.Header[name] = values
	}
	req.Header.Set("User-Agent", userAgent)
	req.Header.Set("Accept", "application/json, application/problem+json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, outcome{err: err, retry: connectionErrorRetryable(err)}
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		// The answer was lost on the way; asking again is safe (every POST carries an
		// Idempotency-Key) and the next answer may arrive whole.
		return nil, outcome{err: fmt.Errorf("reading ingest's %d answer: %w", resp.StatusCode, err), retry: true}
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return answer, outcome{}
	}
	p := problemFromAnswer(resp, answer)
	return nil, outcome{err: p, retry: p.retryable(), retryAfter: p.RetryAfter}
}

// connectionErrorRetryable reports whether an error that came before any answer may
// go away: all do (refused, reset, EOF, timeout) except a server that fails TLS
// verification or does not speak TLS, which stays so however long one waits.
func connectionErrorRetryable(err error) bool {
	var (
		verification *tls.CertificateVerificationError
		recordHeader tls.RecordHeaderError
		authority    x509.UnknownAuthorityError
		hostname     x509.HostnameError
		invalid      x509.CertificateInvalidError
	)
	switch {
	case errors.As(err, &verification), errors.As(err, &recordHeader),
		errors.As(err, &authority), errors.As(err, &hostname), errors.As(err, &invalid):
		return false
	}
	return true
}

// call sends one request until it succeeds, fails for good or may not be retried any
// more, and decodes a success's JSON answer into answer. op names the call in errors.
func (c *Client) call(ctx context.Context, op, method, path string, header http.Header, body []byte, answer any) error {
	r := retrier{policy: c.retry}
	var last error
	for {
		data, o := c.exchange(ctx, method, path, header, body)
		if o.err == nil {
			if err := json.Unmarshal(data, answer); err != nil {
				return fmt.Errorf("%s: decoding ingest's answer: %w", op, err)
			}
			return nil
		}
		if !o.retry {
			return fmt.Errorf("%s: %w", op, o.err)
		}
		if !causedByContext(ctx, o.err) {
			last = o.err
		}
		if reason := r.backOff(ctx, o.retryAfter); reason != nil {
			return r.stopped(op, reason, last)
		}
	}
}

// causedByContext reports whether err is ctx ending rather than something worth
// reporting on its own.
func causedByContext(ctx context.Context, err error) bool {
	ctxErr := ctx.Err()
	return ctxErr != nil && errors.Is(err, ctxErr)
}
