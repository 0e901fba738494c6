package cli

import (
	"fmt"
	"io"
	stdlog "log"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/governor"
	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/raven"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// Log is the logging settings.
type Log struct {
	Level, Format string
}

// LogSettings registers LOG_LEVEL and LOG_FORMAT.
func LogSettings(s *Settings) *Log {
	l := &Log{}
	s.OneOf(&l.Level, "LOG_LEVEL", "info", "least severe level logged", "debug", "info", "warn", "error")
	s.OneOf(&l.Format, "LOG_FORMAT", "auto", "log format: json, console, or auto (console on a terminal, else json)", "json", "console", "auto")
	return l
}

// zerologFormats sets zerolog's time and duration formats, once: a second Logger in the
// same process (a test running two services) wrote them again while the first logged.
var zerologFormats sync.Once

// Logger builds the logger the settings ask for, writing to w.
func (l *Log) Logger(w io.Writer, service string) zerolog.Logger {
	format := l.Format
	if format == "auto" {
		format = "json"
		if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
			format = "console"
		}
	}
	if format == "console" {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000"}
	}
	zerologFormats.Do(func() { // zerolog's globals, read by every line: set once, before any
		zerolog.TimeFieldFormat = "2006-01-02T15:04:05.000Z07:00"
		zerolog.DurationFieldUnit = time.Millisecond
	})
	level, _ := zerolog.ParseLevel(l.Level)
	log := zerolog.New(w).Level(level).With().Timestamp().Str("service", service).Logger()
	RouteStdLog(log)
	return log
}

// RouteStdLog makes what Go's standard library writes through the log package a line of
// log, at warn (a handler's recovered panic at error), with "component":"go": net/http's "http: TLS handshake error from ...",
// "Unsolicited response received on idle HTTP channel ..." (a raven that writes after
// its answer), a handler's recovered panic. Otherwise each would be a plain-text line
// among the JSON ones, which a log pipeline parsing JSON drops or stops at.
func RouteStdLog(log zerolog.Logger) {
	stdlog.SetFlags(0)
	stdlog.SetPrefix("")
	stdlog.SetOutput(stdLogLines{log.With().Str("component", "go").Logger()})
}

// stdLogLines writes each line the log package writes as a warning of log.
type stdLogLines struct{ log zerolog.Logger }

func (w stdLogLines) Write(p []byte) (int, error) {
	line := strings.TrimRight(string(p), "\n")
	level := zerolog.WarnLevel
	if strings.HasPrefix(line, "http: panic serving") { // a handler's panic, with its stack
		level = zerolog.ErrorLevel
	}
	w.log.WithLevel(level).Msg(line)
	return len(p), nil
}

// NATS is where to find NATS and how to connect.
type NATS struct {
	URL string
	queue.Security
}

// NATSSettings registers NATS_URL and the NATS credential and TLS settings, for a
// service connecting in role (its replies arrive under that role's inbox prefix, where
// the deployments' permissions let that user alone subscribe).
func NATSSettings(s *Settings, role queue.Role) *NATS {
	n := &NATS{}
	s.String(&n.InboxPrefix, "NATS_INBOX_PREFIX", queue.InboxPrefix(role), "subject prefix of this service's reply inboxes; its NATS user must be allowed to subscribe to <prefix>.>")
	s.URLs(&n.URL, "NATS_URL", "nats://127.0.0.1:4222", "NATS server URL, or a comma-separated list of a cluster's servers; a user and password may be given in it (nats://user:password@host:4222)", "nats", "tls")
	s.String(&n.User, "NATS_USER", "", "NATS user name (instead of one in NATS_URL)")
	s.Secret(&n.Password, "NATS_PASSWORD", "NATS user's password (instead of one in NATS_URL)")
	s.String(&n.CredsFile, "NATS_CREDS_FILE", "", "NATS credentials file (user JWT and NKey seed)")
	s.String(&n.NKeySeedFile, "NATS_NKEY_SEED_FILE", "", "file holding a NATS NKey user seed")
	s.String(&n.CAFile, "NATS_TLS_CA", "", "CA certificates (PEM) NATS servers' certificates must chain to; turns TLS on")
	s.String(&n.CertFile, "NATS_TLS_CERT", "", "client certificate (PEM) for NATS servers that verify clients; turns TLS on")
	s.String(&n.KeyFile, "NATS_TLS_KEY", "", "the client certificate's private key (PEM)")
	return n
}

// Connect connects to NATS with these settings.
func (n *NATS) Connect(name string, log zerolog.Logger) (*queue.Conn, error) {
	return queue.Connect(n.URL, name, log, n.Security)
}

// ConnectOnce connects a tool that runs one command: one try at each server, failing
// within seconds with what went wrong.
func (n *NATS) ConnectOnce(name string) (*queue.Conn, error) {
	return queue.ConnectOnce(n.URL, name, 3*time.Second, n.Security)
}

// QueueSettings registers the stream settings.
func QueueSettings(s *Settings) *queue.Config {
	c := &queue.Config{}
	var partitions, replicas int64
	s.Int(&partitions, "PARTITIONS", queue.DefaultPartitions, 1, 1024, "partitions client subjects are spread over; fixed when the stream is created")
	s.Int(&replicas, "STREAM_REPLICAS", queue.DefaultReplicas, 1, 5, "stream replicas: 1 on a single node, 3 on a cluster")
	s.Int(&c.BacklogCap, "BACKLOG_CAP", queue.DefaultBacklogCap, 1, 1<<40, "most requests one client may have queued; past it ingest answers 429")
	s.Int(&c.MaxBytes, "QUEUE_MAX_BYTES", 0, 0, 1<<50, "cap on the request stream's size in bytes, 0 for none; past it ingest answers 503")
	s.Duration(&c.DuplicateWindow, "DUPLICATE_WINDOW", queue.DefaultDuplicateWindow, time.Second, "how long an Idempotency-Key is remembered")
	s.Duration(&c.DeadLetterMaxAge, "DEADLETTER_MAX_AGE", 0, 0, "how long dead letters are kept, 0 for until removed")
	s.Duration(&c.StatusRetention, "STATUS_RETENTION", queue.DefaultStatusRetention, time.Minute, "how long request events, and so each request's status, are kept")
	s.Int(&c.EventsMaxBytes, "EVENTS_MAX_BYTES", 0, 0, 1<<50, "cap on the events stream's size in bytes, 0 for none; past it the oldest events go")
	s.afterParse(func() { c.Partitions, c.Replicas = int(partitions), int(replicas) })
	return c
}

// Ingest is the ingest API settings.
type Ingest struct {
	Addr string
	ingest.Config
	TokensFile, Tokens        string
	TLSCert, TLSKey, ClientCA string
}

// IngestSettings registers the ingest API settings.
func IngestSettings(s *Settings) *Ingest {
	c := &Ingest{}
	var publishing, batchItems, waits, reads int64
	s.String(&c.Addr, "INGEST_ADDR", ":8080", "address the ingest API listens on (:port is every interface); the standalone dispatcher binds 127.0.0.1:8080 unless this is set")
	s.Int(&c.MaxBodyBytes, "MAX_BODY_BYTES", ingest.DefaultMaxBodyBytes, 1, 64<<20, "largest request body accepted, in bytes")
	s.Duration(&c.PublishTimeout, "PUBLISH_TIMEOUT", ingest.DefaultPublishTimeout, time.Millisecond, "how long ingest waits for JetStream to acknowledge a request")
	s.Duration(&c.BodyTimeout, "BODY_READ_TIMEOUT", ingest.DefaultBodyTimeout, time.Millisecond, "how long ingest waits for a request's body; a caller sending less than its Content-Length gets 408 then")
	s.Int(&publishing, "MAX_PUBLISHING", ingest.DefaultMaxPublishing, 1, 1_000_000, "publishes waiting for JetStream at once; past it ingest answers 503 overloaded")
	s.Duration(&c.MaxNotBefore, "MAX_NOT_BEFORE", DefaultMaxNotBefore, time.Second, "how far ahead a request's Not-Before may be; further is a 400")
	s.Int(&batchItems, "BATCH_MAX_ITEMS", ingest.DefaultBatchMaxItems, 1, 1_000_000, "most items in one batch; more is a 413")
	s.Int(&c.BatchMaxBytes, "BATCH_MAX_BYTES", ingest.DefaultBatchMaxBytes, 1, 1<<30, "largest batch body, in bytes; larger is a 413")
	s.Duration(&c.MaxStatusWait, "MAX_STATUS_WAIT", ingest.DefaultMaxStatusWait, time.Second, "cap on a status read's ?wait")
	s.Int(&waits, "MAX_STATUS_WAITS", ingest.DefaultMaxStatusWaits, 1, 1_000_000, "status reads waiting (?wait) at once; past it such a read gets 503 overloaded")
	s.Int(&reads, "MAX_STATUS_READS", ingest.DefaultMaxStatusReads, 1, 1_000_000, "status reads without ?wait being read at once; past it a read gets 503 overloaded")
	s.Int(&c.BatchInFlightBytes, "BATCH_INFLIGHT_BYTES", 0, 0, 1<<40, "bytes of batches read and stored at once (at least BATCH_MAX_BYTES); past it a batch gets 503 overloaded before it is read; 0: 64 MiB, or BATCH_MAX_BYTES when that is more")
	s.String(&c.TokensFile, "INGEST_TOKENS_FILE", "", "file of accepted bearer tokens, as hex SHA-256 hashes, one per line, each optionally scoped (tenant=NAME clients=PATTERN,...); re-read when it changes")
	s.Token(&c.Tokens, "INGEST_TOKEN", "accepted bearer token(s), comma-separated, each at least 32 characters; with neither this nor INGEST_TOKENS_FILE, ingest accepts anyone", true)
	s.String(&c.TLSCert, "INGEST_TLS_CERT", "", "certificate (PEM) to serve the ingest API over TLS")
	s.String(&c.TLSKey, "INGEST_TLS_KEY", "", "the certificate's private key (PEM)")
	s.String(&c.ClientCA, "INGEST_TLS_CLIENT_CA", "", "CA certificates (PEM) client certificates must chain to: turns mutual TLS on")
	s.afterParse(func() {
		c.MaxPublishing, c.BatchMaxItems, c.MaxStatusWaits, c.MaxStatusReads = int(publishing), int(batchItems), int(waits), int(reads)
	})
	return c
}

// EventsSetting registers EVENTS: whether requests' events (and so their statuses) are
// written. On by default.
func EventsSetting(s *Settings, on *bool) {
	*on = true
	s.Bool(on, "EVENTS", "write each request's events (accepted, attempts, delivered, dead-lettered, replayed, purged) to the EVENTS stream, for GET /v1/requests/{id} and for penguin to follow; false turns both off")
}

// LaneWaitSetting registers LANE_WAIT: how long the admin API, the console and
// dispatchctl wait for the running dispatchers to describe their lanes (a dispatcher that
// answers later is left out of that answer). def is the admin package's default.
func LaneWaitSetting(s *Settings, p *time.Duration, def time.Duration) {
	s.Duration(p, "LANE_WAIT", def, time.Millisecond, "how long a clients page, a request's state or the console waits for the running dispatchers to describe their lanes; at most 10s. The wait ends early once every dispatcher known by its heartbeat has answered")
}

// Dispatch is the dispatcher and raven client settings.
type Dispatch struct {
	dispatch.Config
	Raven raven.Config
}

// DispatchSettings registers the dispatcher's settings. DISPATCH_INTERVAL is also read
// by ingest, as the Retry-After of a 429.
func DispatchSettings(s *Settings) *Dispatch {
	c := &Dispatch{}
	var attempts, inFlight, recent, budgetInFlight, keepBytes int64
	s.URL(&c.Raven.URL, "RAVEN_URL", "", "where requests are sent (POST): one URL", "http", "https")
	s.SigningSecrets(&c.Raven.Signing, "RAVEN_SIGNING_SECRET", "sign every attempt to raven (Standard Webhooks: webhook-id, webhook-timestamp, webhook-signature) with this secret; several, space-separated, while one rotates; unset: attempts are not signed")
	s.Duration(&c.Raven.Timeout, "RAVEN_TIMEOUT", raven.DefaultTimeout, time.Millisecond, "bound on one attempt to raven")
	s.Duration(&c.Raven.IdleTimeout, "RAVEN_IDLE_TIMEOUT", raven.DefaultIdleTimeout, time.Millisecond, "how long a connection to raven is kept idle for the next attempt; keep it below raven's own idle timeout, or an attempt may go out on a connection raven is closing")
	s.Int(&keepBytes, "RESPONSE_MAX_BYTES", raven.DefaultKeepBytes, 0, request.MaxAnswerBytes, "how much of raven's answer body is kept with each request's outcome, for penguin to read in its status (a failed attempt's: at most 4 KiB); 0 keeps none (raven's status is kept always)")
	s.HeaderNames(&c.Raven.KeepHeaders, "RESPONSE_HEADERS", strings.Join(raven.DefaultKeepHeaders, ","), "raven's answer headers kept with it, comma-separated; the word none keeps none")
	s.Duration(&c.Interval, "DISPATCH_INTERVAL", schedule.DefaultInterval, time.Millisecond, "least time between the end of one attempt for a client and the start of the next")
	s.Duration(&c.BackoffBase, "RETRY_BACKOFF_BASE", schedule.DefaultBackoffBase, time.Millisecond, "backoff after a request's first transient failure; doubles after each")
	s.Duration(&c.BackoffMax, "RETRY_BACKOFF_MAX", schedule.DefaultBackoffMax, time.Millisecond, "cap on the retry backoff")
	s.Int(&attempts, "MAX_ATTEMPTS", schedule.DefaultMaxAttempts, 1, 1_000_000, "attempts before a request is dead-lettered")
	s.Duration(&c.MaxAge, "MAX_AGE", schedule.DefaultMaxAge, time.Second, "a request that fails transiently this long after its first attempt is dead-lettered")
	s.Int(&inFlight, "MAX_IN_FLIGHT", dispatch.DefaultMaxInFlight, 1, 1_000_000, "most attempts in flight at once, across clients")
	s.Duration(&c.ShutdownGrace, "SHUTDOWN_GRACE", dispatch.DefaultShutdownGrace, 0, "how long a stopping dispatcher waits for attempts in flight")
	s.Duration(&c.LeaseTTL, "LEASE_TTL", dispatch.DefaultLeaseTTL, 100*time.Millisecond, "how long a partition lease lives unless renewed; a crashed dispatcher's partitions move after about this plus one interval")
	s.Int(&recent, "RECENT_DELIVERIES", dispatch.DefaultRecentDeliveries, 0, 10_000_000, "deliveries remembered by id for dispatchctl request (about 150 bytes each); 0 for none")
	s.Float(&c.Budget.MaxRate, "RAVEN_MAX_RATE", 0, 0, request.MaxBudgetRate, "raven's budget: attempts per second across all dispatcher instances, each holding to its share; 0 for no limit (dispatchctl budget changes it at runtime)")
	s.Int(&budgetInFlight, "RAVEN_MAX_INFLIGHT", 0, 0, request.MaxBudgetInFlight, "raven's budget: attempts in flight at once across all dispatcher instances; 0 for no limit (when set, at least partitions ÷ the fewest partitions an instance holds)")
	s.Bool(&c.Adaptive.Enabled, "RAVEN_ADAPTIVE", "adapt the rate to raven's answers: cut it when raven answers 429/503 or times out, or is slow; raise it step by step while raven answers in time; a 503 with Retry-After pauses every send")
	s.Float(&c.Adaptive.Threshold, "RAVEN_ADAPTIVE_THRESHOLD", governor.DefaultAdaptiveThreshold, 0.001, 0.5, "adaptive: share of a second's attempts refused (429, 503, timeout) above which the rate is cut")
	s.Duration(&c.Adaptive.LatencyTarget, "RAVEN_LATENCY_TARGET", 0, 0, "adaptive: the rate is cut when more than a tenth of a second's attempts take longer; 0 for a quarter of RAVEN_TIMEOUT")
	s.Float(&c.Adaptive.Decrease, "RAVEN_ADAPTIVE_DECREASE", governor.DefaultAdaptiveDecrease, 0.1, 0.99, "adaptive: what a cut multiplies the rate by")
	s.Float(&c.Adaptive.Increase, "RAVEN_ADAPTIVE_INCREASE", governor.DefaultAdaptiveIncrease, 0.005, 1, "adaptive: the step up after each good second, as a share of the rate before the last cut")
	s.String(&c.InstanceID, "INSTANCE_ID", "", "this dispatcher's name in the lease store, unique among live instances; empty for host name plus a random suffix")
	s.afterParse(func() {
		c.MaxAttempts, c.MaxInFlight = int(attempts), int(inFlight)
		c.RecentDeliveries = int(recent)
		c.Budget.MaxInFlight = int(budgetInFlight)
		if recent == 0 {
			c.RecentDeliveries = -1 // none
		}
		c.SendTimeout = c.Raven.Timeout
		c.Raven.KeepBytes = int(keepBytes)
	})
	return c
}

// CheckRetention refuses settings under which a request's status expires while the
// request can still be asked about as new: a STATUS_RETENTION shorter than
// DUPLICATE_WINDOW, in which a retried POST with the same Idempotency-Key is answered
// with the id of a request whose status is already gone. Nothing to check with events off.
func CheckRetention(q queue.Config, events bool) error {
	q = q.WithDefaults()
	if events && q.StatusRetention < q.DuplicateWindow {
		return fmt.Errorf("STATUS_RETENTION=%s is shorter than DUPLICATE_WINDOW=%s: a request retried with the same Idempotency-Key would get an id whose status is already gone; set STATUS_RETENTION to at least DUPLICATE_WINDOW",
			q.StatusRetention, q.DuplicateWindow)
	}
	return nil
}

// DefaultMaxNotBefore is the services' MAX_NOT_BEFORE, 24 hours. (It was chosen as
// STATUS_RETENTION's default when a request delayed past the retention read as unknown;
// since ingest finds such a request in the queue through the dispatchers, the two are
// independent.) The ingest package's own default, for a Config that leaves the limit
// zero, is longer: this one is what the binaries use.
const DefaultMaxNotBefore = 24 * time.Hour
