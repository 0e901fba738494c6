// Package raven is the HTTP client to the downstream service. It sends one stored request
// and turns raven's answer into a typed outcome: nil for 2xx, a *request.PermanentError for an
// answer that retrying cannot fix, a *request.TransientError (perhaps with a Retry-After) for one
// that it can.
package raven

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/tracing"
	"github.com/penguinhq/dispatcher/pkg/webhook"
)

// Defaults for Config.
const (
	DefaultTimeout = 10 * time.Second
	// DefaultIdleTimeout is RAVEN_IDLE_TIMEOUT: how long a connection to raven is kept
	// idle for the next attempt. Below the shortest idle timeout common HTTP servers
	// apply (gunicorn's 2 s; Node.js, Apache and uvicorn close after 5 s): a connection
	// raven is closing as idle is never picked for an attempt, which would fail "reset"
	// having reached no one.
	DefaultIdleTimeout   = time.Second
	maxResponseBodyBytes = 64 << 10
	maxRetryAfter        = 24 * time.Hour
	// maxResponseHeaderBytes bounds the headers of raven's answer.
	maxResponseHeaderBytes = 1 << 20
	// DefaultKeepBytes is RESPONSE_MAX_BYTES: 64 KiB of each answer's body kept.
	DefaultKeepBytes = 64 << 10
)

// DefaultKeepHeaders is RESPONSE_HEADERS: the answer's Content-Type, to read its body by.
var DefaultKeepHeaders = []string{"Content-Type"}

// Config configures the client.
type Config struct {
	// URL is where requests are POSTed. Required.
	URL string
	// Timeout bounds one attempt, from dialing to the end of the response. Defaults to 10s.
	Timeout time.Duration
	// MaxConns caps idle and open connections to raven. Defaults to 1024.
	MaxConns int
	// IdleTimeout is how long an idle connection is kept for the next attempt
	// (RAVEN_IDLE_TIMEOUT). Defaults to DefaultIdleTimeout.
	IdleTimeout time.Duration
	// UserAgent is sent with every attempt, so that raven (and whoever reads its logs)
	// can tell which dispatcher instance sent it. Defaults to "dispatcher".
	UserAgent string
	// KeepBytes is how much of each answer's body is kept with the attempt's outcome
	// (RESPONSE_MAX_BYTES, at most request.MaxAnswerBytes); 0 keeps none. Raven's status
	// is kept whatever this says.
	KeepBytes int
	// KeepHeaders names the answer's headers kept with it (RESPONSE_HEADERS).
	KeepHeaders []string
	// Signing holds the secrets every attempt is signed with (RAVEN_SIGNING_SECRET): the
	// Standard Webhooks headers, one signature per secret, so that raven can tell the
	// attempt came from the dispatcher and is fresh (package webhook). None by default:
	// attempts are not signed.
	Signing []webhook.Secret
	// Transport carries the attempts: nil for a connection pool of MaxConns to raven's
	// address whose connections are reset when closed (see New). A simulation sets its
	// own in-memory one.
	Transport http.RoundTripper
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxConns == 0 {
		c.MaxConns = 1024
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.UserAgent == "" {
		c.UserAgent = "dispatcher"
	}
	return c
}

// Validate reports what is wrong with c.
func (c Config) Validate() error {
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		// Not the URL itself: it may carry a password or a key (user:password@, ?api_key=).
		return errors.New("raven URL: must be an absolute http:// or https:// URL")
	}
	if c.Timeout <= 0 {
		return fmt.Errorf("raven timeout %s: must be positive", c.Timeout)
	}
	if c.IdleTimeout < 0 {
		return fmt.Errorf("raven idle timeout %s: must be positive", c.IdleTimeout)
	}
	if c.KeepBytes < 0 || c.KeepBytes > request.MaxAnswerBytes {
		return fmt.Errorf("response body kept %d bytes: must be 0 (none) to %d", c.KeepBytes, request.MaxAnswerBytes)
	}
	for _, h := range c.KeepHeaders {
		if h == "" || strings.ContainsAny(h, " \t:\r\n") {
			return fmt.Errorf("response header %q: must be a header name such as Content-Type", h)
		}
	}
	return nil
}

// Client sends requests to raven.
type Client struct {
	cfg  Config
	http *http.Client
}

// New returns a Client for cfg.
func New(cfg Config) (*Client, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = cfg.MaxConns
	tr.MaxIdleConnsPerHost = cfg.MaxConns
	tr.IdleConnTimeout = cfg.IdleTimeout
	// net/http's default is 10 MiB of headers an answer: with MAX_IN_FLIGHT attempts at
	// once, tens of GB held for answers whose headers nobody keeps whole (a kept header
	// is cut to 1 KiB). An answer with more is a broken one, retried.
	tr.MaxResponseHeaderBytes = maxResponseHeaderBytes
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dialer.DialContext(ctx, network, addr)
		if tc, ok := conn.(*net.TCPConn); ok {
			// Closing a connection resets it, and the kernel stops sending what it had
			// not delivered yet: a request held up in a partition that heals after the
			// attempt timed out does not arrive then, after the dispatcher counted the
			// attempt failed and scheduled the next one (with a normal close the kernel
			// would go on retransmitting it). Bytes raven's kernel already received
			// are still handed to raven: a stalled raven may act late on an attempt
			// that timed out, as any raven slower than RAVEN_TIMEOUT may.
			_ = tc.SetLinger(0)
		}
		return conn, err
	}
	var rt http.RoundTripper = tr
	if cfg.Transport != nil {
		rt = cfg.Transport
	}
	return &Client{cfg: cfg, http: &http.Client{
		Transport: rt,
		Timeout:   cfg.Timeout,
		// A redirect is raven's answer, not an instruction to send the request elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}, nil
}

// Send POSTs one attempt of st. It returns nil when raven answered 2xx.
func (c *Client) Send(ctx context.Context, st request.Stored, attempt int) error {
	_, err := c.SendAnswer(ctx, st, attempt)
	return err
}

// SendAnswer is Send that also gives raven's answer as the record keeps it (nil when
// raven did not answer): its status, the headers named in KeepHeaders, and its body up
// to KeepBytes.
func (c *Client) SendAnswer(ctx context.Context, st request.Stored, attempt int) (*request.Response, error) {
	// The attempt, resent at once if it provably reached no one, all within one
	// RAVEN_TIMEOUT: the lease's margin counts on an attempt ending by then.
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	answer, unsent, err := c.exchange(ctx, st, attempt)
	if unsent && ctx.Err() == nil {
		answer, _, err = c.exchange(ctx, st, attempt)
	}
	return answer, err
}

// exchange is one exchange of an attempt with raven. unsent says that it failed on a
// connection kept from an earlier attempt before a byte of it was written: raven got
// nothing (a connection it had just closed as idle), and it may be sent again at once.
func (c *Client) exchange(ctx context.Context, st request.Stored, attempt int) (answer *request.Response, unsent bool, err error) {
	// Atomic: net/http calls WroteHeaders from its write loop, not this goroutine.
	var reused, wrote atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn:      func(i httptrace.GotConnInfo) { reused.Store(i.Reused) },
		WroteHeaders: func() { wrote.Store(true) },
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.cfg.URL, bytes.NewReader(st.Body))
	if err != nil {
		return nil, false, &request.PermanentError{Err: errors.New("building the request failed (is RAVEN_URL a valid URL?)")}
	}
	// One attempt is one exchange on the wire. With GetBody set (NewRequest sets it for a
	// bytes reader), net/http takes a POST carrying an Idempotency-Key for replayable and
	// sends it again by itself when a reused connection fails before the answer: a second
	// attempt, moments after the first, that the dispatcher neither spaced nor counted.
	// Without GetBody the body cannot be rewound, so neither HTTP/1 nor HTTP/2 sends it
	// twice; a failed exchange comes back as an error and the scheduler decides the retry.
	req.GetBody = nil
	if req.Body == http.NoBody {
		// An empty body is NoBody, which net/http takes for replayable as it is: give it
		// an empty reader of its own instead.
		req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(nil)), 0
	}
	if st.ContentType != "" {
		req.Header.Set("Content-Type", st.ContentType)
	}
	req.Header.Set(request.HeaderIdempotencyKey, st.ID)
	req.Header.Set(request.HeaderClientID, st.ClientID)
	req.Header.Set(request.HeaderAttempt, strconv.Itoa(attempt))
	req.Header.Set("User-Agent", c.cfg.UserAgent)
	// Signed at the attempt's time, with the request id as the webhook id: a raven
	// that verifies refuses an attempt replayed more than webhook.Tolerance later.
	webhook.Sign(req.Header, c.cfg.Signing, st.ID, time.Now(), st.Body)
	// The attempt's trace context, when tracing is on: raven's own spans join the
	// request's trace. Otherwise the one stored with the request (the caller's, or the
	// accept span's), passed on unchanged as an intermediary does.
	tracing.Propagator.Inject(ctx, propagation.HeaderCarrier(req.Header))
	if req.Header.Get("Traceparent") == "" && st.TraceParent != "" {
		req.Header.Set("Traceparent", st.TraceParent)
		if st.TraceState != "" {
			req.Header.Set("Tracestate", st.TraceState)
		}
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, reused.Load() && !wrote.Load(), &request.TransientError{Err: noAnswer(err)}
	}
	if resp.StatusCode < http.StatusOK {
		// 101 Switching Protocols: the body is the connection itself, raw, which no
		// timeout or cancel ends; reading it would hold the attempt for ever.
		_ = resp.Body.Close()
		return request.NewResponse(resp.StatusCode, resp.Header, c.cfg.KeepHeaders, nil, false), false,
			Classify(resp.StatusCode, resp.Header.Get("Retry-After"), time.Now())
	}
	kept, truncated := c.readBody(resp.Body, resp.ContentLength)
	_ = resp.Body.Close()
	answer = request.NewResponse(resp.StatusCode, resp.Header, c.cfg.KeepHeaders, kept, truncated)
	return answer, false, Classify(resp.StatusCode, resp.Header.Get("Retry-After"), time.Now())
}

// readBody reads the answer's body: up to KeepBytes kept (truncated when there was more,
// or the body broke off), the rest up to maxResponseBodyBytes read and dropped, so that
// the connection can carry the next attempt.
//
// size is the body's length when raven said it (-1 otherwise): the buffer is made to fit.
func (c *Client) readBody(r io.Reader, size int64) (kept []byte, truncated bool) {
	if keep := c.cfg.KeepBytes; keep > 0 && size != 0 {
		r := io.LimitReader(r, int64(keep)+1)
		if size > 0 {
			// One read into a buffer of its size: the body ends one byte short of it,
			// unless there is more than is kept, or ends sooner when it broke off.
			buf := make([]byte, min(size, int64(keep))+1)
			n, _ := io.ReadFull(r, buf)
			kept, truncated = buf[:n], int64(n) < min(size, int64(keep))
		} else {
			b, err := io.ReadAll(r)
			kept, truncated = b, err != nil
		}
		if len(kept) > keep {
			kept, truncated = kept[:keep], true
		}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(r, maxResponseBodyBytes))
	return kept, truncated
}

// Classify turns an HTTP status (and Retry-After header) into an outcome.
func Classify(status int, retryAfter string, now time.Time) error {
	switch {
	case status >= 200 && status < 300:
		return nil
	case status == http.StatusRequestTimeout, status == http.StatusTooEarly,
		status == http.StatusTooManyRequests, status >= 500:
		return &request.TransientError{Status: status, After: ParseRetryAfter(retryAfter, now)}
	default:
		return &request.PermanentError{Status: status}
	}
}

// ParseRetryAfter reads a Retry-After value, seconds or an HTTP date, into a wait from
// now. Anything unreadable, negative or absurd (over a day) counts as absent (zero).
func ParseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	var d time.Duration
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 || secs > int64(maxRetryAfter/time.Second) {
			return 0
		}
		d = time.Duration(secs) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	if d < 0 || d > maxRetryAfter {
		return 0
	}
	return d
}

// The words for an exchange with raven that got no answer (SendError.Kind).
const (
	NoAnswerTimeout     = "timeout"            // no answer within RAVEN_TIMEOUT
	NoAnswerRefused     = "connection_refused" // nothing listens at raven's address
	NoAnswerReset       = "reset"              // the connection was reset or closed mid-exchange
	NoAnswerUnreachable = "unreachable"        // no route to raven's host or network
	NoAnswerDNS         = "dns"                // raven's host name did not resolve
	NoAnswerTLS         = "tls"                // the TLS handshake or raven's certificate failed
	NoAnswerProtocol    = "protocol"           // raven answered what is not HTTP
	NoAnswerCanceled    = "canceled"           // the dispatcher gave the attempt up (stopping)
	NoAnswerOther       = "other"
)

// SendError is an exchange with raven that got no answer. Its text is a word from a fixed
// vocabulary (the NoAnswer constants), never raven's URL: the URL may carry credentials
// or a key (user:password@, ?api_key=), and this text reaches the events, penguin's
// status reads, dead letters and logs. Unwrap gives the cause without the URL, for
// errors.Is.
type SendError struct {
	Kind  string
	cause error
}

func (e *SendError) Error() string { return noAnswerText + e.Kind }

const noAnswerText = "no answer from raven: "

// TimedOutText says whether an attempt's error, as its text was logged or recorded, is
// raven not answering in time: for readers of the logs that explain a duplicate delivery
// (raven may have acted on an attempt the dispatcher gave up on).
func TimedOutText(cause string) bool {
	return strings.HasSuffix(cause, noAnswerText+NoAnswerTimeout)
}

// Unwrap returns the cause, without raven's URL.
func (e *SendError) Unwrap() error { return e.cause }

// Timeout says whether raven did not answer in time (what the adaptive budget counts as
// raven overloaded).
func (e *SendError) Timeout() bool { return e.Kind == NoAnswerTimeout }

// Is makes an exchange that timed out request.ErrNoAnswerInTime.
func (e *SendError) Is(target error) bool {
	return target == request.ErrNoAnswerInTime && e.Timeout()
}

// noAnswer turns what net/http returned for an exchange without an answer into a
// SendError.
func noAnswer(err error) *SendError {
	cause := err
	var ue *url.Error
	if errors.As(err, &ue) {
		cause = ue.Err // url.Error's text is the method and the whole URL
	}
	return &SendError{Kind: noAnswerKind(cause), cause: cause}
}

func noAnswerKind(err error) string {
	var dns *net.DNSError
	var netErr net.Error
	var certErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var recordErr tls.RecordHeaderError
	var alert tls.AlertError
	switch {
	case errors.Is(err, context.Canceled):
		return NoAnswerCanceled
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return NoAnswerTimeout
	case errors.As(err, &dns):
		return NoAnswerDNS
	case errors.Is(err, syscall.ECONNREFUSED):
		return NoAnswerRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, net.ErrClosed):
		return NoAnswerReset
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTDOWN), errors.Is(err, syscall.ENETDOWN):
		return NoAnswerUnreachable
	case errors.As(err, &certErr), errors.As(err, &unknownAuth), errors.As(err, &hostErr), errors.As(err, &recordErr), errors.As(err, &alert):
		return NoAnswerTLS
	}
	if msg := err.Error(); strings.Contains(msg, "tls:") || strings.Contains(msg, "x509:") {
		return NoAnswerTLS
	} else if strings.Contains(msg, "malformed HTTP") || strings.Contains(msg, "HTTP/1.x transport connection broken") ||
		strings.Contains(msg, "server response headers exceeded") || strings.Contains(msg, "response header list larger than") {
		return NoAnswerProtocol
	}
	return NoAnswerOther
}
