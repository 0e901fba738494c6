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

	"github.com/penguinhq/dispatcher/pkg/request"
)

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
	ack, err := q.js.PublishMsg(ctx, requestMsg(r), jetstream.WithMsgID(r.ID), jetstream.WithExpectStream(RequestStream))
	if err != nil {
		err = classifyPublishError(err)
		q.writes.note(err)
		return request.Receipt{}, err
	}
	q.writes.note(nil)
	return request.Receipt{Seq: ack.Sequence, Duplicate: ack.Duplicate}, nil
}

// PublishAll stores rs together: it publishes them all at once and waits for every
// acknowledgement, or ctx. It returns a receipt or an error (as Publish's) for each, in
// order.
func (q *Queue) PublishAll(ctx context.Context, rs []request.Request) ([]request.Receipt, []error) {
	receipts, errs := make([]request.Receipt, len(rs)), make([]error, len(rs))
	fail := func(err error) ([]request.Receipt, []error) {
		for i := range errs {
			errs[i] = err
		}
		return receipts, errs
	}
	if !q.nc.IsConnected() {
		return fail(fmt.Errorf("%w: not connected to NATS (%s)", request.ErrUnavailable, q.nc.Status()))
	}
	if err := q.WriteErr(); err != nil {
		return fail(fmt.Errorf("%w: the store does not take writes: %w", request.ErrUnavailable, err))
	}
	start := time.Now()
	q.batchMu.Lock()
	atomically := len(rs) <= atomicMax && q.batchCosts.atomicNext(len(rs), start)
	q.batchMu.Unlock()
	if atomically {
		switch err := q.publishAtomic(ctx, rs, receipts); {
		case err == nil:
			q.batchMu.Lock()
			q.batchCosts.note(true, len(rs), time.Since(start))
			q.batchMu.Unlock()
			return receipts, errs
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled), errors.Is(err, nats.ErrTimeout):
			// Not known to be stored, as when publishes one by one go unanswered: the
			// caller hears so, and a retry with the same ids lands once.
			if ctx.Err() != nil {
				return fail(fmt.Errorf("%w: no acknowledgement in time: %w", request.ErrUnavailable, ctx.Err()))
			}
			return fail(fmt.Errorf("%w: no acknowledgement of the batch within %s: %w", request.ErrUnavailable, q.cfg.AckTimeout, jetstream.ErrAsyncPublishTimeout))
		}
		start = time.Time{} // one by one after a refusal: not a measure of that way
	}
	q.publishEach(ctx, rs, receipts, errs)
	if !start.IsZero() && errors.Join(errs...) == nil {
		q.batchMu.Lock()
		q.batchCosts.note(false, len(rs), time.Since(start))
		q.batchMu.Unlock()
	}
	return receipts, errs
}

// publishAtomic stores rs as one atomic batch (ADR 11), filling receipts, and waits for
// the acknowledgement up to the queue's AckTimeout. All or none: a batch the server
// refuses (one request over its client's backlog cap, one sent before, the queue full)
// stores nothing, and PublishAll then stores them one by one, each with its own answer.
func (q *Queue) publishAtomic(ctx context.Context, rs []request.Request, receipts []request.Receipt) error {
	ctx, cancel := context.WithTimeout(ctx, q.cfg.AckTimeout)
	defer cancel()
	msgs := make([]*nats.Msg, len(rs))
	for i, r := range rs {
		msgs[i] = requestMsg(r)
		msgs[i].Header.Set(jetstream.MsgIDHeader, r.ID)
	}
	last, err := publishAtomic(ctx, q.js, RequestStream, msgs)
	if err != nil {
		return err
	}
	q.writes.note(nil)
	for i := range rs {
		receipts[i] = request.Receipt{Seq: last - uint64(len(rs)-1-i)}
	}
	return nil
}

// publishEach publishes rs at once, each on its own, and waits for every
// acknowledgement, or ctx, filling receipts and errs.
func (q *Queue) publishEach(ctx context.Context, rs []request.Request, receipts []request.Receipt, errs []error) {
	futures := make([]jetstream.PubAckFuture, len(rs))
	for i, r := range rs {
		futures[i], errs[i] = q.js.PublishMsgAsync(requestMsg(r), jetstream.WithMsgID(r.ID), jetstream.WithExpectStream(RequestStream))
		if errs[i] != nil {
			errs[i] = fmt.Errorf("%w: %w", request.ErrUnavailable, errs[i])
		}
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		var ack *jetstream.PubAck
		select {
		case ack = <-f.Ok():
		case errs[i] = <-f.Err():
		default:
			if ctx.Err() != nil { // an answer already in counts; wait no longer for the rest
				break
			}
			select {
			case ack = <-f.Ok():
			case errs[i] = <-f.Err():
			case <-ctx.Done():
			}
		}
		switch {
		case ack != nil:
			receipts[i] = request.Receipt{Seq: ack.Sequence, Duplicate: ack.Duplicate}
			q.writes.note(nil)
		case errs[i] != nil:
			errs[i] = classifyPublishError(errs[i])
			q.writes.note(errs[i])
		default:
			// Not known to be stored: the caller hears so, and a retry with the same id
			// is dropped as a duplicate if it was.
			errs[i] = fmt.Errorf("%w: no acknowledgement in time: %w", request.ErrUnavailable, ctx.Err())
		}
	}
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
	return q.backlog(ctx, request.RequestPrefix+">")
}

// PartitionBacklog lists the lanes of partition p that have requests queued, with how
// many each.
func (q *Queue) PartitionBacklog(ctx context.Context, p int) (map[request.Lane]uint64, error) {
	subjects, err := q.backlog(ctx, partitionFilter(p))
	if err != nil {
		return nil, err
	}
	lanes := make(map[request.Lane]uint64, len(subjects))
	for subject, n := range subjects {
		if lane, err := request.LaneOf(subject); err == nil { // the stream stores no other
			lanes[lane] = n
		}
	}
	return lanes, nil
}

func (q *Queue) backlog(ctx context.Context, filter string) (map[string]uint64, error) {
	info, err := q.reqs.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, fmt.Errorf("listing backlog of %s: %w", filter, err)
	}
	return info.State.Subjects, nil
}

// Watch calls fn with the lane of every request stored from now on in one of
// partitions, from one light ordered consumer (headers only, no acks, memory, R1): a
// dispatcher watches the partitions it owns, and is not sent the others' requests. A
// watch over every partition filters on the whole request stream, one filter. onErr
// hears about consumer trouble: a gap is possible then, and the caller should list the
// backlog again. Stop the watch by calling the returned function.
//
// The consumer is created before Watch returns, so that a listing of a partition's
// backlog made after it, with what the watch gives, misses no request. It starts at the
// stream's next sequence rather than at "new": an ordered consumer that has given
// nothing yet and is created again (after a reconnect, say) starts where it was asked
// to, and so gives what was stored meanwhile.
func (q *Queue) Watch(ctx context.Context, partitions []int, fn func(request.Lane), onErr func(error)) (stop func(), err error) {
	filters := q.watchFilters(partitions)
	if len(filters) == 0 { // no filter would be the whole stream
		return nil, fmt.Errorf("creating backlog watch: no partition of %d in %v", q.cfg.Partitions, partitions)
	}
	info, err := q.reqs.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("creating backlog watch: %w", err)
	}
	cons, err := q.reqs.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: filters,
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    info.State.LastSeq + 1,
		HeadersOnly:    true,
	})
	if err != nil {
		return nil, fmt.Errorf("creating backlog watch: %w", err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if lane, err := request.LaneOf(m.Subject()); err == nil { // the stream stores no other
			fn(lane)
		}
	},
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) { onErr(err) }))
	if err != nil {
		return nil, fmt.Errorf("starting backlog watch: %w", err)
	}
	return func() {
		cc.Stop()
		// A stopped ordered consumer stays on the server until its inactivity threshold
		// (5 min); a dispatcher starts its watch again as its partitions move. The
		// delete is waited for (briefly), so that one stopped at shutdown is gone too.
		if info := cons.CachedInfo(); info != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = q.reqs.DeleteConsumer(ctx, info.Name)
		}
	}, nil
}

// partitionFilter is the subjects of partition p's requests: every lane in it.
func partitionFilter(p int) string { return request.RequestPrefix + strconv.Itoa(p) + ".*" }

// watchFilters are the subjects of partitions' requests: one filter when they are all of
// them.
func (q *Queue) watchFilters(partitions []int) []string {
	seen := make(map[int]bool, len(partitions))
	filters := make([]string, 0, len(partitions))
	for _, p := range partitions {
		if p >= 0 && p < q.cfg.Partitions && !seen[p] {
			seen[p] = true
			filters = append(filters, partitionFilter(p))
		}
	}
	if len(seen) == q.cfg.Partitions {
		return []string{request.RequestPrefix + ">"}
	}
	return filters
}

// Head returns the oldest request of lane; ok is false when it has none. A request whose
// lane's token is no valid clientId comes back with ok true and an
// *request.UndecodableError. After ProveHeadReads, the head is read only through a NATS
// server a write has gone through since the connection moved to it (link.go); else the
// error wraps ErrLinkUnproven.
func (q *Queue) Head(ctx context.Context, lane request.Lane) (st request.Stored, ok bool, err error) {
	subject := lane.Subject()
	link, err := q.provenLink(ctx)
	if err != nil {
		return request.Stored{}, false, fmt.Errorf("reading head of %s: %w", subject, err)
	}
	m, err := q.reqs.GetMsg(ctx, 0, jetstream.WithGetMsgSubject(subject))
	if err == nil || errors.Is(err, jetstream.ErrMsgNotFound) {
		if moved := q.stillProven(link); moved != nil {
			return request.Stored{}, false, fmt.Errorf("reading head of %s: %w", subject, moved)
		}
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return request.Stored{}, false, nil
	}
	if err != nil {
		return request.Stored{}, false, fmt.Errorf("reading head of %s: %w", subject, err)
	}
	st = storedOf(m.Subject, m.Header, m.Data, m.Sequence, m.Time)
	if _, decodeErr := request.ClientIDOf(m.Subject); decodeErr != nil {
		// Not written by ingest (someone published straight to the subject): the caller
		// gets it with an request.UndecodableError, to move it aside rather than send it or stall
		// on it.
		return st, true, &request.UndecodableError{Err: decodeErr}
	}
	return st, true, nil
}

// Find looks for the queued request id in lane, reading headers only (FindRequest on the
// lane's client); ok is false when it is not queued there. It is the cancel's read, as
// Head is the send's, and proves its link the same way after ProveHeadReads.
func (q *Queue) Find(ctx context.Context, lane request.Lane, id string) (st request.Stored, ok bool, err error) {
	clientID, err := lane.ClientID()
	if err != nil {
		return request.Stored{}, false, err
	}
	link, err := q.provenLink(ctx)
	if err != nil {
		return request.Stored{}, false, fmt.Errorf("looking for %s: %w", id, err)
	}
	f, ok, err := q.FindRequest(ctx, id, clientID)
	if err == nil {
		err = q.stillProven(link)
	}
	if err != nil {
		return request.Stored{}, false, err
	}
	return f.Stored, ok, nil
}

// Delete removes request seq of lane from the queue; for a request already gone, the
// error wraps request.ErrNotQueued. The stream's sequence names the request alone: the
// lane is not needed to find it.
func (q *Queue) Delete(ctx context.Context, _ request.Lane, seq uint64) error {
	link := q.link()
	err := q.reqs.DeleteMsg(ctx, seq)
	if err != nil && !isNotFound(err) {
		q.writes.note(err)
		return fmt.Errorf("deleting request %d: %w", seq, err)
	}
	q.writes.note(nil)
	q.writeLanded(link)
	if err != nil {
		return fmt.Errorf("deleting request %d: %w", seq, request.ErrNotQueued)
	}
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

// requestMsg is the message a request is stored as, on its client's subject: the id and
// Content-Type in headers, the body byte for byte.
func requestMsg(r request.Request) *nats.Msg {
	// Every request publishes one: its header values share one array, and the map has
	// room for the message id and expected stream nats.go adds.
	vals := [2]string{r.ID, r.ContentType}
	h := make(nats.Header, 6)
	h[request.HeaderID] = vals[0:1:1]
	if r.ContentType != "" {
		h[request.HeaderContentType] = vals[1:2:2]
	}
	msg := &nats.Msg{Subject: request.RequestSubject(r.ClientID), Header: h}
	setPlanHeaders(msg.Header, r)
	msg.Data = r.Body
	return msg
}

// setPlanHeaders writes r's not-before and not-after times, replay count and trace
// context, when it has them.
func setPlanHeaders(h nats.Header, r request.Request) {
	if !r.NotAfter.IsZero() {
		h.Set(request.HeaderNotAfter, r.NotAfter.UTC().Format(time.RFC3339Nano))
	}
	if !r.NotBefore.IsZero() {
		h.Set(request.HeaderNotBefore, r.NotBefore.UTC().Format(time.RFC3339Nano))
	}
	if r.Cycle > 0 {
		h.Set(request.HeaderCycle, strconv.Itoa(r.Cycle))
	}
	if r.BodyDigest != "" {
		h.Set(request.HeaderBodyDigest, r.BodyDigest)
	}
	if r.TraceParent != "" {
		h.Set(request.HeaderTraceParent, r.TraceParent)
		if r.TraceState != "" {
			h.Set(request.HeaderTraceState, r.TraceState)
		}
	}
}

// storedOf reads a stored request (or a dead letter's request) back from its message; the
// clientId is empty when the subject holds no valid token.
func storedOf(subject string, h nats.Header, body []byte, seq uint64, at time.Time) request.Stored {
	clientID, _ := request.ClientIDOf(subject)
	lane, _ := request.LaneOf(subject) // none for a dead letter's
	// A header that does not parse (not written by this service) reads as none.
	notBefore, _ := time.Parse(time.RFC3339Nano, h.Get(request.HeaderNotBefore))
	notAfter, _ := time.Parse(time.RFC3339Nano, h.Get(request.HeaderNotAfter))
	cycle, _ := strconv.Atoi(h.Get(request.HeaderCycle))
	return request.Stored{
		Request: request.Request{
			ID:          h.Get(request.HeaderID),
			ClientID:    clientID,
			ContentType: h.Get(request.HeaderContentType),
			Body:        body,
			NotBefore:   notBefore,
			NotAfter:    notAfter,
			Cycle:       max(cycle, 0),
			TraceParent: h.Get(request.HeaderTraceParent),
			TraceState:  h.Get(request.HeaderTraceState),
			BodyDigest:  h.Get(request.HeaderBodyDigest),
		},
		Seq:        seq,
		Subject:    subject,
		Lane:       lane,
		AcceptedAt: at,
	}
}
