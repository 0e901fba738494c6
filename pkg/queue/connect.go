package queue

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// Connect dials NATS at url (a comma-separated list of servers) and keeps reconnecting
// for as long as the connection is open: a service rides out a NATS restart instead of
// exiting. Connection events are logged.
func Connect(url, name string, log zerolog.Logger) (*nats.Conn, error) {
	nc, err := nats.Connect(url, connectOptions(name, log)...)
	if err != nil {
		return nil, fmt.Errorf("connecting to NATS at %s: %w", RedactURLs(url), err)
	}
	return nc, nil
}

// RedactURLs hides the passwords in a comma-separated list of NATS URLs, for logs and
// error messages.
func RedactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil {
			parts[i] = u.Redacted()
		}
	}
	return strings.Join(parts, ",")
}

// ConnectInProcess connects to an embedded server without a network socket.
func ConnectInProcess(s *server.Server, name string, log zerolog.Logger) (*nats.Conn, error) {
	nc, err := nats.Connect("", append(connectOptions(name, log), nats.InProcessServer(s))...)
	if err != nil {
		return nil, fmt.Errorf("connecting to embedded NATS: %w", err)
	}
	return nc, nil
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
