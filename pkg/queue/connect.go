package queue

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Security is how a service proves who it is to NATS and checks the server, beyond a
// user and password in the URL. Empty fields are not used.
type Security struct {
	// User and Password authenticate with a user name and password (a pair in the URL
	// works too).
	User, Password string
	// CredsFile is a NATS credentials file (a user JWT and its NKey seed).
	CredsFile string
	// NKeySeedFile holds an NKey user seed.
	NKeySeedFile string
	// CAFile holds the CA certificates the server's certificate must chain to; setting
	// it (or CertFile) makes the connection use TLS.
	CAFile string
	// CertFile and KeyFile are a client certificate, for servers that verify clients.
	CertFile, KeyFile string
	// InboxPrefix is the subject prefix of the connection's reply inboxes (InboxPrefix
	// of the service's role); empty is NATS's shared default, _INBOX.
	InboxPrefix string
}

func (s Security) options() ([]nats.Option, error) {
	var opts []nats.Option
	if (s.User == "") != (s.Password == "") {
		return nil, fmt.Errorf("NATS_USER and NATS_PASSWORD: give both or neither")
	}
	if s.User != "" {
		opts = append(opts, nats.UserInfo(s.User, s.Password))
	}
	if s.CredsFile != "" && s.NKeySeedFile != "" {
		return nil, fmt.Errorf("NATS_CREDS_FILE and NATS_NKEY_SEED_FILE: give one, not both")
	}
	if s.CredsFile != "" {
		if _, err := os.Stat(s.CredsFile); err != nil {
			return nil, fmt.Errorf("NATS_CREDS_FILE: %w", err)
		}
		opts = append(opts, nats.UserCredentials(s.CredsFile))
	}
	if s.NKeySeedFile != "" {
		opt, err := nats.NkeyOptionFromSeed(s.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("NATS_NKEY_SEED_FILE: %w", err)
		}
		opts = append(opts, opt)
	}
	if (s.CertFile == "") != (s.KeyFile == "") {
		return nil, fmt.Errorf("NATS_TLS_CERT and NATS_TLS_KEY: give both or neither")
	}
	if s.CAFile != "" {
		if _, err := os.Stat(s.CAFile); err != nil {
			return nil, fmt.Errorf("NATS_TLS_CA: %w", err)
		}
		opts = append(opts, nats.RootCAs(s.CAFile))
	}
	if s.CertFile != "" {
		opts = append(opts, nats.ClientCert(s.CertFile, s.KeyFile))
	}
	if s.CAFile != "" || s.CertFile != "" {
		opts = append(opts, nats.Secure())
	}
	if s.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(s.InboxPrefix))
	}
	return opts, nil
}

// Conn is a connection to NATS as the services hold it: it reconnects for as long as it
// is open, so that a service rides out a NATS restart instead of exiting.
type Conn struct{ nc *nats.Conn }

// Connect dials NATS at url (a comma-separated list of servers; a user and password may
// be given in it). Connection events are logged; passwords are not.
func Connect(url, name string, log zerolog.Logger, sec Security) (*Conn, error) {
	opts, err := sec.options()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(url, append(connectOptions(name, log), opts...)...)
	if err != nil {
		return nil, fmt.Errorf("connecting to NATS at %s: %w", RedactURLs(url), err)
	}
	return &Conn{nc: nc}, nil
}

// ConnectOnce dials NATS for a tool that runs one command: each server in url is tried
// once, each dial bounded by dialTimeout (a connection made rides out a short blip
// afterwards). The error says which went wrong: a server refused the credentials
// (ErrRefused; said first, if any server did), or no server could be reached
// (ErrUnreachable).
func ConnectOnce(url, name string, dialTimeout time.Duration, sec Security) (*Conn, error) {
	opts, err := sec.options()
	if err != nil {
		return nil, err
	}
	opts = append(opts, nats.Name(name), nats.Timeout(dialTimeout), nats.MaxReconnects(10), nats.ReconnectWait(500*time.Millisecond))
	nc, err := nats.Connect(url, opts...)
	if err == nil {
		return &Conn{nc: nc}, nil
	}
	// nats.go reports the last server's error only: a refusal by another is what
	// the operator must hear, so look at each server alone.
	if servers := strings.Split(url, ","); !isRefusal(err) && len(servers) > 1 {
		for _, one := range servers {
			if one, oerr := nats.Connect(strings.TrimSpace(one), opts...); oerr == nil {
				one.Close()
			} else if isRefusal(oerr) {
				err = oerr
				break
			}
		}
	}
	who := "the credentials given"
	if sec.User != "" {
		who = fmt.Sprintf("user %q", sec.User)
	}
	switch {
	case isRefusal(err):
		return nil, fmt.Errorf("%w: NATS at %s refused %s (%v): check NATS_USER and NATS_PASSWORD, or the credentials file",
			ErrRefused, RedactURLs(url), who, err)
	case errors.Is(err, nats.ErrNoServers):
		return nil, fmt.Errorf("%w at %s: no server there took a connection (each tried once, for up to %s)", ErrUnreachable, RedactURLs(url), dialTimeout)
	case isDialError(err):
		return nil, fmt.Errorf("%w at %s: %v", ErrUnreachable, RedactURLs(url), err)
	}
	return nil, fmt.Errorf("connecting to NATS at %s: %w", RedactURLs(url), err)
}

func isRefusal(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked)
}

// Errors of ConnectOnce.
var (
	ErrUnreachable = errors.New("cannot reach NATS")
	ErrRefused     = errors.New("NATS refused the credentials")
)

func isDialError(err error) bool {
	var opErr *net.OpError
	return errors.As(err, &opErr) || errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// Open opens the queue on c (see the function Open).
func (c *Conn) Open(ctx context.Context, cfg Config, ensure Ensure) (*Queue, error) {
	return Open(ctx, c.nc, cfg, ensure)
}

// Connected says whether the connection is up now (it reconnects by itself when not).
func (c *Conn) Connected() bool { return c.nc.IsConnected() }

// MaxPayload is the largest message the server takes.
func (c *Conn) MaxPayload() int64 { return c.nc.MaxPayload() }

// Close closes the connection at once.
func (c *Conn) Close() { c.nc.Close() }

// Drain lets what is in flight finish (subscriptions and publishes), then closes the
// connection; it waits up to wait for that.
func (c *Conn) Drain(wait time.Duration) {
	done := make(chan struct{})
	c.nc.SetClosedHandler(func(*nats.Conn) { close(done) })
	if err := c.nc.Drain(); err != nil {
		return
	}
	select {
	case <-done:
	case <-time.After(wait):
	}
}

// RedactURLs hides the passwords in a comma-separated list of NATS URLs, for logs and
// error messages.
func RedactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		switch {
		case err != nil || (u.User == nil && strings.Contains(p, "@")):
			// Unparsable (a password with a character that needs escaping, or a comma,
			// splits the URL oddly): show nothing of it.
			parts[i] = "(a URL that cannot be read, hidden)"
		default:
			parts[i] = u.Redacted()
		}
	}
	return strings.Join(parts, ",")
}

// ConnectInProcess connects to an embedded server without a network socket. Given a
// Node, the connection follows the node's restarts.
func ConnectInProcess(s nats.InProcessConnProvider, name string, log zerolog.Logger, sec ...Security) (*Conn, error) {
	opts := append(connectOptions(name, log), nats.InProcessServer(s))
	for _, sc := range sec {
		more, err := sc.options()
		if err != nil {
			return nil, err
		}
		opts = append(opts, more...)
	}
	nc, err := nats.Connect("", opts...)
	if err != nil {
		return nil, fmt.Errorf("connecting to embedded NATS: %w", err)
	}
	return &Conn{nc: nc}, nil
}

func connectOptions(name string, log zerolog.Logger) []nats.Option {
	return []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn().Err(err).Msg("nats disconnected")
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info().Str("server", nc.ConnectedUrlRedacted()).Msg("nats reconnected")
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Warn().Err(err).Msg("nats async error")
		}),
	}
}

// IsTransient says whether err, from opening the queue or a bucket, may pass by itself:
// NATS not up yet, JetStream not ready, a timeout.
func IsTransient(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.Code == 503 {
		return true // JetStream not up yet
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrConnectionClosed) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrNoServers) ||
		errors.Is(err, nats.ErrDisconnected)
}

// IsNoPeers says whether err is JetStream's "no suitable peers for placement": too few
// nodes are online yet for the replicas asked for (a cluster still forming, or too many
// replicas asked for).
func IsNoPeers(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeNoPeers
}

const errCodeNoPeers = 10005 // JSClusterNoPeersErrF
