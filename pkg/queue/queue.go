package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Queue is the request and dead-letter streams, opened on one connection.
type Queue struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	cfg    Config
	reqs   jetstream.Stream
	dead   jetstream.Stream
	writes writeHealth
	guard  *StoreGuard // set by UseGuard when the server runs in this process
}

// Ensure says what Open does with the streams.
type Ensure int

const (
	// CreateMissing creates streams that do not exist and leaves existing ones as they are.
	CreateMissing Ensure = iota
	// CreateOrUpdate also brings existing streams' settings in line with the Config.
	CreateOrUpdate
	// Existing opens the streams as they are, taking partitions and replicas from them,
	// and fails if they are missing: for tools that must not create or change anything.
	Existing
)

// Open makes sure both streams exist (and, with CreateOrUpdate, match cfg) and returns the
// Queue. It fails if the request stream exists with another partition count, since
// re-partitioning in place would file one client under two partitions.
func Open(ctx context.Context, nc *nats.Conn, cfg Config, ensure Ensure) (*Queue, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	q := &Queue{nc: nc, js: js, cfg: cfg, writes: writeHealth{log: zerolog.Nop()}}
	if ensure == Existing {
		return q.openExisting(ctx)
	}
	if q.reqs, err = q.ensure(ctx, requestStreamConfig(cfg), ensure); err != nil {
		return nil, err
	}
	if err := checkPartitions(q.reqs.CachedInfo().Config, cfg.Partitions); err != nil {
		return nil, err
	}
	if q.dead, err = q.ensure(ctx, deadLetterStreamConfig(cfg), ensure); err != nil {
		return nil, err
	}
	return q, nil
}

func (q *Queue) openExisting(ctx context.Context) (*Queue, error) {
	var err error
	for name, s := range map[string]*jetstream.Stream{RequestStream: &q.reqs, DeadLetterStream: &q.dead} {
		if *s, err = q.js.Stream(ctx, name); err != nil {
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return nil, fmt.Errorf("stream %s does not exist: start a dispatcher once to create the streams", name)
			}
			return nil, fmt.Errorf("stream %s: %w", name, err)
		}
	}
	cfg := q.reqs.CachedInfo().Config
	if cfg.SubjectTransform == nil {
		return nil, fmt.Errorf("stream %s has no partitioning subject transform; it was not created by this service", RequestStream)
	}
	var n int
	if _, err := fmt.Sscanf(cfg.SubjectTransform.Destination, requestPrefix+"{{partition(%d,1)}}", &n); err != nil || n < 1 {
		return nil, fmt.Errorf("stream %s is partitioned as %q, which this service does not read", RequestStream, cfg.SubjectTransform.Destination)
	}
	q.cfg.Partitions, q.cfg.Replicas, q.cfg.DuplicateWindow = n, cfg.Replicas, cfg.Duplicates
	return q, nil
}

func requestStreamConfig(cfg Config) jetstream.StreamConfig {
	maxBytes := cfg.MaxBytes
	if maxBytes <= 0 {
		maxBytes = -1
	}
	return jetstream.StreamConfig{
		Name:        RequestStream,
		Description: "Accepted requests, one subject per client, waiting for dispatch.",
		Subjects:    []string{requestPrefix + "*"},
		SubjectTransform: &jetstream.SubjectTransformConfig{
			Source:      requestPrefix + "*",
			Destination: fmt.Sprintf("%s{{partition(%d,1)}}.{{wildcard(1)}}", requestPrefix, cfg.Partitions),
		},
		Retention:            jetstream.LimitsPolicy,
		Storage:              jetstream.FileStorage,
		Replicas:             cfg.Replicas,
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		MaxMsgsPerSubject:    cfg.BacklogCap,
		MaxBytes:             maxBytes,
		MaxMsgs:              -1,
		Duplicates:           cfg.DuplicateWindow,
		AllowDirect:          directGets(cfg),
	}
}

// directGets says whether head reads may be direct gets. A direct get is answered by any
// replica, and a follower that lags may not have a new request yet (the lane would find
// its client empty) or may still hold a delivered one (it would be sent again); so with
// replicas, reads go through the stream leader.
func directGets(cfg Config) bool { return cfg.Replicas == 1 }

func deadLetterStreamConfig(cfg Config) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        DeadLetterStream,
		Description: "Requests that failed for good, with headers saying why. Replay moves them back.",
		Subjects:    []string{deadLetterPrefix + "*"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Discard:     jetstream.DiscardNew,
		MaxAge:      cfg.DeadLetterMaxAge,
		MaxMsgs:     -1,
		MaxBytes:    -1,
		Duplicates:  cfg.DuplicateWindow,
		AllowDirect: directGets(cfg),
	}
}

func checkPartitions(have jetstream.StreamConfig, want int) error {
	if have.SubjectTransform == nil {
		return fmt.Errorf("stream %s has no partitioning subject transform; it was not created by this service", RequestStream)
	}
	wantDest := requestStreamConfig(Config{Partitions: want}).SubjectTransform.Destination
	if have.SubjectTransform.Destination != wantDest {
		return fmt.Errorf("stream %s is partitioned as %q but PARTITIONS asks for %q: the partition count is fixed when the stream is created (see docs/adr/0001-lanes-not-consumers.md)",
			RequestStream, have.SubjectTransform.Destination, wantDest)
	}
	return nil
}

func (q *Queue) ensure(ctx context.Context, cfg jetstream.StreamConfig, ensure Ensure) (jetstream.Stream, error) {
	s, err := q.js.Stream(ctx, cfg.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		s, err = q.js.CreateStream(ctx, cfg)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) { // another instance won the race
			s, err = q.js.Stream(ctx, cfg.Name)
		}
	case err == nil && ensure == CreateOrUpdate:
		// Keep the partitioning as found: checkPartitions reports a mismatch.
		cfg.SubjectTransform = s.CachedInfo().Config.SubjectTransform
		s, err = q.js.UpdateStream(ctx, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", cfg.Name, err)
	}
	return s, nil
}

// Ready reports whether JetStream answers, both streams are in place and the store
// takes writes (WriteErr).
func (q *Queue) Ready(ctx context.Context) error {
	if !q.nc.IsConnected() {
		return fmt.Errorf("not connected to NATS (%s)", q.nc.Status())
	}
	for _, name := range []string{RequestStream, DeadLetterStream} {
		if _, err := q.js.Stream(ctx, name); err != nil {
			return fmt.Errorf("stream %s: %w", name, err)
		}
	}
	if err := q.WriteErr(); err != nil {
		return fmt.Errorf("the store does not take writes: %w", err)
	}
	return nil
}

// Publish stores r on its client's subject and returns once JetStream acknowledged it.
// Errors are request.ErrBacklogFull, request.ErrQueueFull or request.ErrUnavailable
// (wrapped with the cause).
func (q *Queue) Publish(ctx context.Context, r request.Request) (request.Receipt, error) {
	if !q.nc.IsConnected() {
		// Fail at once rather than wait out the timeout in the reconnect buffer.
		return request.Receipt{}, fmt.Errorf("%w: not connected to NATS (%s)", request.ErrUnavailable, q.nc.Status())
	}
	if err := q.WriteErr(); err != nil {
		// Fail at once too: a store that cannot write does not answer a publish at all,
		// and the caller would wait out the whole timeout to hear 503. The test writes
		// (WatchWrites) find out when it takes writes again.
		return request.Receipt{}, fmt.Errorf("%w: the store does not take writes: %w", request.ErrUnavailable, err)
	}
	msg := nats.NewMsg(requestPrefix + request.EncodeClientID(r.ClientID))
	msg.Header.Set(request.HeaderID, r.ID)
	if r.ContentType != "" {
		msg.Header.Set(request.HeaderContentType, r.ContentType)
	}
	msg.Data = r.Body
	ack, err := q.js.PublishMsg(ctx, msg, jetstream.WithMsgID(r.ID), jetstream.WithExpectStream(RequestStream))
	if err != nil {
		err = classifyPublishError(err)
		q.writes.note(err)
		return request.Receipt{}, err
	}
	q.writes.note(nil)
	return request.Receipt{Seq: ack.Sequence, Duplicate: ack.Duplicate}, nil
}

const (
	errCodeStoreFailed           = 10077 // JSStreamStoreFailedF
	errCodeInsufficientResources = 10023 // JSInsufficientResourcesErr
)

func classifyPublishError(err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch {
		case apiErr.ErrorCode == errCodeStoreFailed && strings.Contains(apiErr.Description, "per subject"):
			return fmt.Errorf("%w: %s", request.ErrBacklogFull, apiErr.Description)
		case apiErr.ErrorCode == errCodeStoreFailed && strings.Contains(apiErr.Description, "maximum"),
			apiErr.ErrorCode == errCodeInsufficientResources:
			return fmt.Errorf("%w: %s", request.ErrQueueFull, apiErr.Description)
		}
	}
	return fmt.Errorf("%w: %w", request.ErrUnavailable, err)
}

// Backlog lists every client subject that has requests queued, with its count.
func (q *Queue) Backlog(ctx context.Context) (map[string]uint64, error) {
	return q.backlog(ctx, requestPrefix+">")
}

// PartitionBacklog lists the client subjects of partition p that have requests queued.
func (q *Queue) PartitionBacklog(ctx context.Context, p int) (map[string]uint64, error) {
	return q.backlog(ctx, requestPrefix+strconv.Itoa(p)+".*")
}

func (q *Queue) backlog(ctx context.Context, filter string) (map[string]uint64, error) {
	info, err := q.reqs.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, fmt.Errorf("listing backlog of %s: %w", filter, err)
	}
	return info.State.Subjects, nil
}

// Partitions is the request stream's partition count.
func (q *Queue) Partitions() int { return q.cfg.Partitions }

// PartitionOf returns the partition of a stored request subject.
func (q *Queue) PartitionOf(subject string) (int, error) { return PartitionOf(subject) }

// Watch calls fn with the subject of every request stored from now on, from one light
// ordered consumer (headers only, no acks, memory, R1). onErr hears about consumer
// trouble: a gap is possible then, and the caller should list the backlog again. Stop the
// watch by calling the returned function.
func (q *Queue) Watch(ctx context.Context, fn func(subject string), onErr func(error)) (stop func(), err error) {
	cons, err := q.reqs.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{requestPrefix + ">"},
		DeliverPolicy:  jetstream.DeliverNewPolicy,
		HeadersOnly:    true,
	})
	if err != nil {
		return nil, fmt.Errorf("creating backlog watch: %w", err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) { fn(m.Subject()) },
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) { onErr(err) }))
	if err != nil {
		return nil, fmt.Errorf("starting backlog watch: %w", err)
	}
	return cc.Stop, nil
}

// Head returns the oldest request on subject; ok is false when the subject is empty. A
// request whose subject holds no valid clientId token comes back with ok true and an
// error wrapping request.ErrUndecodable.
func (q *Queue) Head(ctx context.Context, subject string) (st request.Stored, ok bool, err error) {
	m, err := q.reqs.GetMsg(ctx, 0, jetstream.WithGetMsgSubject(subject))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return request.Stored{}, false, nil
	}
	if err != nil {
		return request.Stored{}, false, fmt.Errorf("reading head of %s: %w", subject, err)
	}
	clientID, decodeErr := ClientIDOf(m.Subject)
	st = request.Stored{
		Request: request.Request{
			ID:          m.Header.Get(request.HeaderID),
			ClientID:    clientID,
			ContentType: m.Header.Get(request.HeaderContentType),
			Body:        m.Data,
		},
		Seq:        m.Sequence,
		Subject:    m.Subject,
		AcceptedAt: m.Time,
	}
	if decodeErr != nil {
		// Not written by ingest (someone published straight to the subject): the caller
		// gets it with ErrUndecodable, to move it aside rather than send it or stall on it.
		return st, true, fmt.Errorf("%w: %w", request.ErrUndecodable, decodeErr)
	}
	return st, true, nil
}

// Delete removes one request from the queue; a request already gone is not an error.
func (q *Queue) Delete(ctx context.Context, seq uint64) error {
	err := q.reqs.DeleteMsg(ctx, seq)
	if err != nil && !isNotFound(err) {
		q.writes.note(err)
		return fmt.Errorf("deleting request %d: %w", seq, err)
	}
	q.writes.note(nil)
	return nil
}

func isNotFound(err error) bool {
	// nats.go flattens the server's answer into the text of ErrMsgDeleteUnsuccessful: "no
	// message found" for a sequence before the first, JSSequenceNotFoundErrF (10043) for
	// one deleted already further in.
	return errors.Is(err, jetstream.ErrMsgNotFound) ||
		(errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) &&
			(strings.Contains(err.Error(), "no message found") || strings.Contains(err.Error(), "err_code=10043")))
}

// DeadLetter writes st to the dead-letter stream with headers saying why. It does not
// delete st from the queue: the caller does that once this returned nil. Writing the same
// stored request twice (a crash between the two steps) keeps one copy.
func (q *Queue) DeadLetter(ctx context.Context, st request.Stored, why request.DeadLetter) error {
	token, err := tokenOf(st.Subject)
	if err != nil {
		return err
	}
	msg := nats.NewMsg(deadLetterPrefix + token)
	h := msg.Header
	h.Set(request.HeaderID, st.ID)
	if st.ContentType != "" {
		h.Set(request.HeaderContentType, st.ContentType)
	}
	h.Set(request.HeaderDeadReason, why.Reason)
	h.Set(request.HeaderDeadLastStatus, strconv.Itoa(why.LastStatus))
	if why.LastError != "" {
		h.Set(request.HeaderDeadLastError, headerSafe(why.LastError))
	}
	h.Set(request.HeaderDeadAttempts, strconv.Itoa(why.Attempts))
	h.Set(request.HeaderDeadFirstAttempt, formatTime(why.FirstAttempt))
	h.Set(request.HeaderDeadLastAttempt, formatTime(why.LastAttempt))
	h.Set(request.HeaderDeadAcceptedAt, formatTime(st.AcceptedAt))
	h.Set(request.HeaderDeadOrigSeq, strconv.FormatUint(st.Seq, 10))
	h.Set(request.HeaderDeadOrigSubject, st.Subject)
	msg.Data = st.Body
	// The message id names this stored copy, not the request: a request replayed and
	// dead-lettered again within the window must not be taken for a duplicate.
	msgID := st.ID + ":" + strconv.FormatUint(st.Seq, 10)
	_, err = q.js.PublishMsg(ctx, msg, jetstream.WithMsgID(msgID), jetstream.WithExpectStream(DeadLetterStream))
	q.writes.note(err)
	if err != nil {
		return fmt.Errorf("dead-lettering request %s: %w", st.ID, err)
	}
	return nil
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// headerSafe keeps an error text to one line of bounded length.
func headerSafe(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > 512 {
		s = s[:512]
	}
	return s
}

// PartitionOf returns the partition of a stored request subject.
func PartitionOf(subject string) (int, error) {
	rest, ok := strings.CutPrefix(subject, requestPrefix)
	if !ok {
		return 0, fmt.Errorf("subject %q is not a request subject", subject)
	}
	p, _, ok := strings.Cut(rest, ".")
	if !ok {
		return 0, fmt.Errorf("subject %q has no partition", subject)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		return 0, fmt.Errorf("subject %q: partition %q: %w", subject, p, err)
	}
	return n, nil
}

// ClientIDOf returns the clientId a stored request subject belongs to.
func ClientIDOf(subject string) (string, error) {
	token, err := tokenOf(subject)
	if err != nil {
		return "", err
	}
	return request.DecodeClientID(token)
}

func tokenOf(subject string) (string, error) {
	i := strings.LastIndexByte(subject, '.')
	if !strings.HasPrefix(subject, requestPrefix) || i < 0 || i == len(subject)-1 {
		return "", fmt.Errorf("subject %q is not a request subject", subject)
	}
	return subject[i+1:], nil
}
