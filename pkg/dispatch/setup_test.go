package dispatch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// The in-memory parts the dispatcher's unit tests run against: a Source that keeps
// requests in a slice, a Sender that records attempts and answers as told, and a clock
// that moves only when the test moves it.

// memSource is a Source in memory: each request on its lane, its Subject as the queue
// would store it.
type memSource struct {
	mu          sync.Mutex
	partitions  int
	seq         uint64
	queued      []request.Stored
	dead        []deadLetter
	undecodable map[uint64]bool // these heads come with an Undecodable error
	headErr     error           // every Head fails with it, when set
	deleteFails int             // the next deleteFails Deletes fail
	// deleteAnswersLost: the next this many Deletes of a queued request land and fail.
	deleteAnswersLost int
	deletes           int
	kept              []request.Event // final events kept (KeepOutcome)
	keepFails         int             // the next keepFails KeepOutcomes fail
}

type deadLetter struct {
	request.Stored
	why request.Verdict
}

func newMemSource(partitions int) *memSource {
	return &memSource{partitions: partitions, undecodable: map[uint64]bool{}}
}

// laneOf is client's lane in partition p.
func laneOf(p int, client string) request.Lane { return request.LaneOfClient(p, client) }

// add queues a request on lane and returns it.
func (m *memSource) add(lane request.Lane, id string, acceptedAt time.Time) request.Stored {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seq++
	client, _ := lane.ClientID()
	st := request.Stored{Request: request.Request{ID: id, ClientID: client, Body: []byte(id)}, Seq: m.seq, Subject: lane.Subject(), Lane: lane, AcceptedAt: acceptedAt}
	m.queued = append(m.queued, st)
	return st
}

func (m *memSource) Partitions() int { return m.partitions }

func (m *memSource) PartitionBacklog(_ context.Context, p int) (map[request.Lane]uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[request.Lane]uint64{}
	for _, st := range m.queued {
		if st.Lane.Partition == p {
			out[st.Lane]++
		}
	}
	return out, nil
}

func (m *memSource) Watch(context.Context, []int, func(request.Lane), func(error)) (func(), error) {
	return func() {}, nil
}

func (m *memSource) Head(_ context.Context, lane request.Lane) (request.Stored, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.headErr != nil {
		return request.Stored{}, false, m.headErr
	}
	for _, st := range m.queued {
		if st.Lane == lane {
			if m.undecodable[st.Seq] {
				return st, true, &request.UndecodableError{Err: errors.New("not written by ingest")}
			}
			return st, true, nil
		}
	}
	return request.Stored{}, false, nil
}

func (m *memSource) Find(_ context.Context, lane request.Lane, id string) (request.Stored, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, st := range m.queued {
		if st.Lane == lane && st.ID == id {
			st.Body = nil
			return st, true, nil
		}
	}
	return request.Stored{}, false, nil
}

func (m *memSource) Delete(_ context.Context, lane request.Lane, seq uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.deletes++
	if m.deleteFails > 0 {
		m.deleteFails--
		return errors.New("store unavailable")
	}
	for i, st := range m.queued {
		if st.Seq == seq { // by its sequence, as the queue deletes
			if st.Lane != lane {
				panic(fmt.Sprintf("delete of request %d named lane %s; it is queued in %s", seq, lane, st.Lane))
			}
			m.queued = append(m.queued[:i], m.queued[i+1:]...)
			if m.deleteAnswersLost > 0 {
				m.deleteAnswersLost--
				return errors.New("timed out waiting for the answer")
			}
			return nil
		}
	}
	return fmt.Errorf("deleting request %d: %w", seq, request.ErrNotQueued)
}

func (m *memSource) KeepOutcome(_ context.Context, e request.Event) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.keepFails > 0 {
		m.keepFails--
		return errors.New("store unavailable")
	}
	m.kept = append(m.kept, e)
	return nil
}

func (m *memSource) AddDeadLetter(_ context.Context, st request.Stored, why request.Verdict) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dead = append(m.dead, deadLetter{st, why})
	return nil
}

// ids lists the ids queued, in order.
func (m *memSource) ids() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, st := range m.queued {
		out = append(out, st.ID)
	}
	return out
}

func (m *memSource) deadLetters() []deadLetter {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]deadLetter(nil), m.dead...)
}

// sent is one attempt the sender saw.
type sent struct {
	id      string
	attempt int
	at      time.Time
}

// memSender records attempts and answers each with answer (nil: accepted).
type memSender struct {
	mu     sync.Mutex
	clock  *fakeClock
	sent   []sent
	answer func(st request.Stored, attempt int) error
}

func (s *memSender) Send(_ context.Context, st request.Stored, attempt int) error {
	s.mu.Lock()
	s.sent = append(s.sent, sent{st.ID, attempt, s.clock.now()})
	answer := s.answer
	s.mu.Unlock()
	if answer == nil {
		return nil
	}
	return answer(st, attempt)
}

func (s *memSender) attempts() []sent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sent(nil), s.sent...)
}

// fakeClock is a clock that moves only when told to.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// bundle is one dispatcher on in-memory parts, with the test's clock and a log the test
// can read.
type bundle struct {
	d     *Dispatcher
	src   *memSource
	snd   *memSender
	clock *fakeClock
	log   *syncBuffer
}

// syncBuffer is a log the dispatcher's goroutines write while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var start = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// setup returns a dispatcher of cfg (its zero fields defaulted; interval 5s unless set)
// on a fresh in-memory source of 4 partitions, its clock at start, jitter fixed.
func setup(t testing.TB, cfg Config) *bundle {
	t.Helper()
	return setupOn(t, 4, cfg)
}

// setupOn is setup on a source of the given number of partitions.
func setupOn(t testing.TB, partitions int, cfg Config) *bundle {
	t.Helper()
	b := &bundle{src: newMemSource(partitions), clock: &fakeClock{t: start}, log: &syncBuffer{}}
	b.snd = &memSender{clock: b.clock}
	if cfg.InstanceID == "" {
		cfg.InstanceID = "unit"
	}
	d, err := New(cfg, b.src, b.snd, zerolog.New(b.log).Level(zerolog.DebugLevel))
	if err != nil {
		t.Fatal(err)
	}
	d.now, d.rand = b.clock.now, func() float64 { return 0.5 }
	b.d = d
	return b
}

// job is the job the scheduler would hand out for lane's first attempt, now.
func (b *bundle) job(lane request.Lane) schedule.Job {
	return schedule.Job{Lane: lane, SendAt: b.clock.now()}
}

func sortedIDs(ds []deadLetter) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.ID+":"+string(d.why.Reason))
	}
	sort.Strings(out)
	return out
}

func TestDefaultInstanceIDIsValid(t *testing.T) {
	t.Parallel()
	for _, host := range []string{"", "web-1", "a.b.c", "node_7", strings.Repeat("h", 70), "ünïcode"} {
		id := instanceIDOf(host, "0123456789")
		if err := ValidInstanceID(id); err != nil {
			t.Errorf("host %q: default id %q: %v", host, id, err)
		}
	}
	if err := ValidInstanceID(DefaultInstanceID()); err != nil {
		t.Fatalf("this machine's default id: %v", err)
	}
}

// The takeover bound the README states, with the defaults: 40.7 s.
func TestTakeoverBoundWithTheDefaults(t *testing.T) {
	c := Config{Policy: schedule.Policy{Interval: 5 * time.Second}, LeaseTTL: 30 * time.Second, SendTimeout: 10 * time.Second}
	if got := c.TakeoverBound().Round(100 * time.Millisecond); got != 40700*time.Millisecond {
		t.Fatalf("takeover bound %s with the defaults, want 40.7s as the README says", got)
	}
}
