package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// recordLayout is one way to lay out the status record in a stream, for benchRecord.
type recordLayout struct {
	name string
	// subjects are the messages one delivered request leaves in the record.
	subjects func(client, id string) []string
	// read reads id's record back: the round trips it took, and whether it found it.
	// seq is the request's place in the order of acceptance (a request stream's sequence).
	read func(ctx context.Context, nc *nats.Conn, client, id string, seq uint64) (trips int, found bool, err error)
	body int // bytes of raven's answer stored with the final event
	// jumps: each final names its client's previous final and one further back (a
	// skew-binary jump pointer), by stream sequence: readJumps follows them.
	jumps bool
	// service: the service's own layout and read (ADR 10, 18): attempt_started and
	// delivered events on the events stream's subjects, read as ingest reads a status
	// (queue.StatusEvents), or with timeline, as the console reads a request's events
	// (queue.Events; read is not used).
	service, timeline bool
	// mixed: some requests also have a failed attempt, and some are dead-lettered
	// (mixedRequest), so that a client's subjects other than its deliveries have events
	// later than the request read.
	mixed bool
}

// The layouts benchRecord compares. perRequest is ADR 8's: a subject per event of every
// request (accepted and delivered), read with multi_last over the id's subjects.
// perClient keeps one subject per client and event type, the id in a header: the final
// event only (the request in the queue is the record of its acceptance), read with a
// direct get of the first message on the client's subject at or after the id's time
// (ids start with their milliseconds), in batches until the id is found.
var recordLayouts = []recordLayout{
	{name: "a subject per event of every request (ADR 8)", subjects: func(client, id string) []string {
		return []string{"rec." + client + "." + id + ".accepted", "rec." + client + "." + id + ".delivered"}
	}, read: readMultiLast},
	{name: "a subject per client and event type, id in a header", subjects: func(client, id string) []string {
		return []string{"rec." + client + ".delivered"}
	}, read: readByTime},
	{name: "a subject per client and event type, id in a header, 1 KiB answer stored", subjects: func(client, id string) []string {
		return []string{"rec." + client + ".delivered"}
	}, read: readByTime, body: 1024},
	{name: "a subject per client and event type, id in a header, read by time then bisected by sequence", subjects: func(client, id string) []string {
		return []string{"rec." + client + ".delivered"}
	}, read: readBisect},
	{name: "a subject per client and event type, id in a header, read back from the client's last final by jump pointers", subjects: func(client, id string) []string {
		return []string{"rec." + client + ".delivered"}
	}, read: readJumps, jumps: true},
	{name: "the service's (ADR 10, 18): attempt_started and delivered events per client and type, read as a status", subjects: serviceSubjects, service: true},
	{name: "the service's (ADR 10), every 10th request of a client with a failed attempt first and every 25th dead-lettered, read as a status", subjects: serviceSubjects, service: true, mixed: true},
	{name: "the service's (ADR 10), every 10th request of a client with a failed attempt first and every 25th dead-lettered, read as the console's timeline (every subject, as status reads did before)", subjects: serviceSubjects, service: true, mixed: true, timeline: true},
	{name: "the service's (ADR 10), raven's 1 KiB answer on each delivered event (ADR 12), read as a status", subjects: serviceSubjects, service: true, body: 1024},
}

// serviceSubjects are the events the service stores for a request delivered at its first
// attempt, on its subjects (its acceptance is not stored, ADR 18).
func serviceSubjects(client, _ string) []string {
	return []string{request.ClientEventSubject(client, request.EventAttemptStarted), request.ClientEventSubject(client, request.EventDelivered)}
}

// mixedRequest says what happens to the request of the given round of its client in a
// mixed layout: a failed attempt before its delivery (every 10th), or a dead letter in
// place of it (every 25th). Of the 100 rounds of the size, 98 and 99 are such
// rounds, so that the requests read (the last 24th written: rounds 96 to 99) have later
// events of those types, as a client's requests mostly do when its failures are spread.
func mixedRequest(round int) (failedFirst, deadLettered bool) {
	return round%10 == 8, round%25 == 24
}

// jumpNode is one final of a client as the writer of the jump-pointer layout remembers
// it: where it is, its place in its client's order of acceptance, and its jump.
type jumpNode struct {
	seq, place uint64
	jump       int // the index of its jump in the client's finals; -1 for none
}

// benchRecord measures what the status record costs the server as requests pile up,
// for each layout on a fresh embedded server of its own (fsync every 2 min, the
// cluster's default): the subjects its stream holds after N requests over C clients,
// the Go heap the process (the server, mostly) holds per retained request once the store
// sat idle 30 s (its block caches expired), and the latency of a status read of random
// requests accepted in the last hour of a day's retention (the last 24th written). The
// events are written as fast as the server takes them, a round of one
// request per client at a time; the figure is what is retained, not the rate. Each
// request's final event follows its acceptance at once (an idle client's case): with k
// requests ahead of it in its client's queue, a read by time scans k more messages.
func benchRecord(ctx context.Context, s settings, log io.Writer) ([]row, error) {
	n, c := s.recordRequests, s.recordClients
	var rows []row
	var failed []error
	for i, l := range recordLayouts {
		if s.recordLayouts != "" && !strings.Contains(","+s.recordLayouts+",", ","+strconv.Itoa(i+1)+",") {
			continue
		}
		if l.mixed && s.recordLag > 0 {
			fmt.Fprintf(log, "bench: record, %s: not measured with -record-lag\n", l.name)
			continue
		}
		r, err := measureRecord(ctx, l, n, c, s.recordLag, s.recordIdle, s.recordSettle, s.recordReads, log)
		if err != nil {
			// A layout that cannot be measured (the server not keeping up with one at
			// this size) does not take the others' figures with it.
			fmt.Fprintf(log, "bench: record, %s: not measured: %v\n", l.name, err)
			failed = append(failed, fmt.Errorf("%s: %w", l.name, err))
			continue
		}
		for _, row := range r { // as each layout ends: a long run stopped later keeps them
			fmt.Fprintf(log, "bench: record: %s: %s (%s; %s)\n", row.figure, row.value, row.reference, row.verdict)
		}
		rows = append(rows, r...)
	}
	return rows, errors.Join(failed...)
}

// After the idle, when settle is longer, it waits until settle has passed since the
// writes ended, so that every block's cache (10 s unused) and subject state (2 min) has
// expired, as it has for an hour-old request in a running store: it measures the heap
// again, then reads one request from each of coldReads stretches of the last hour, each
// the first read into its part of the store (cold), before the random reads (which land
// mostly in blocks a read before them loaded).
func measureRecord(ctx context.Context, l recordLayout, n, c, lag int, idle, settle time.Duration, reads int, log io.Writer) ([]row, error) {
	node, err := startNode(ctx, false, queue.Config{NoEvents: !l.service})
	if err != nil {
		return nil, err
	}
	defer node.close()
	js, err := jetstream.New(node.nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return nil, err
	}
	streamName := queue.EventStream // the service's, as the queue made it
	if !l.service {
		streamName = "RECORD"
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "RECORD", Subjects: []string{"rec.>"}, Storage: jetstream.FileStorage,
			AllowDirect: true, MaxAge: 24 * time.Hour}); err != nil {
			return nil, err
		}
	}
	runtime.GC()
	before := heapInUse()
	t0 := time.Now()
	sample, err := newRecordWriter(l, js, c).writeAll(n, c, lag)
	if err != nil {
		return nil, err
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		return nil, fmt.Errorf("writes not acknowledged within 5 minutes")
	}
	wrote := time.Since(t0)
	stream, err := js.Stream(ctx, streamName)
	if err != nil {
		return nil, err
	}
	info := stream.CachedInfo()
	fmt.Fprintf(log, "bench: record, %s: %d requests over %d clients written in %s (%d messages, %d subjects); idle %s\n",
		l.name, n, c, wrote.Round(time.Millisecond), info.State.Msgs, info.State.NumSubjects, idle)
	time.Sleep(idle)
	runtime.GC()
	m := recordFigures{n: n, c: c, lag: lag, idle: idle, settle: settle, subjects: info.State.NumSubjects,
		heap: heapInUse() - before}
	if len(sample) == 0 {
		return nil, fmt.Errorf("no request has its final event: -record-lag (%d) must be below the requests per client (%d)", lag, n/c)
	}
	if settle > idle {
		time.Sleep(settle - idle)
		runtime.GC()
		m.settledHeap, m.settled = heapInUse()-before, true
	}
	if err := m.readSample(ctx, l, node, sample, reads); err != nil {
		return nil, err
	}
	return m.rows(l), nil
}

// recordFigures is what the record scenario measured of one layout.
type recordFigures struct {
	n, c, lag         int
	idle, settle      time.Duration
	subjects          uint64
	heap, settledHeap int64 // held after idle, and after settle (when settled)
	settled           bool
	lat, cold         []time.Duration
	trips, coldTrips  int
	// ref are the latencies of the reference read, for the service's layouts: one direct
	// get of the first event on the read request's client's delivered subject from its
	// id's time (next_by_subj, no batch), of the same requests, on the same stream.
	ref []time.Duration
}

// readSample reads the sampled requests back: coldReads of them first once the store
// settled (when it was let settle), then up to reads at random.
func (m *recordFigures) readSample(ctx context.Context, l recordLayout, node *node, sample []written, reads int) error {
	read := l.read
	if l.service {
		read = func(ctx context.Context, _ *nats.Conn, client, id string, _ uint64) (int, bool, error) {
			readEvents := node.q.StatusEvents
			if l.timeline {
				readEvents = node.q.Events
			}
			events, err := readEvents(ctx, client, id)
			return 0, request.StatusOf(id, events).State == request.StateDelivered, err
		}
	}
	trips, missing := 0, 0
	readOne := func(w written) (time.Duration, error) {
		start := time.Now()
		t, found, err := read(ctx, node.nc, w.client, w.id, w.seq)
		trips += t
		if !found {
			missing++
		}
		return time.Since(start), err
	}
	if m.settled {
		for i := range coldReads {
			d, err := readOne(sample[i*len(sample)/coldReads])
			if err != nil {
				return err
			}
			m.cold = append(m.cold, d)
		}
		slices.Sort(m.cold)
	}
	m.coldTrips = trips
	rng := rand.New(rand.NewPCG(1, 2))
	for range min(len(sample), reads) {
		d, err := readOne(sample[rng.IntN(len(sample))])
		if err != nil {
			return err
		}
		m.lat = append(m.lat, d)
	}
	slices.Sort(m.lat)
	m.trips = trips - m.coldTrips
	if l.service && !l.timeline {
		if err := m.readReference(ctx, node, sample, reads); err != nil {
			return err
		}
	}
	if missing > 0 {
		return fmt.Errorf("%d of %d reads did not find their request", missing, len(m.lat)+len(m.cold))
	}
	return nil
}

// readReference reads the sample's requests as readSample did (the same picks), each
// with one next_by_subj direct get: the least any status read by time must do.
func (m *recordFigures) readReference(ctx context.Context, node *node, sample []written, reads int) error {
	rng := rand.New(rand.NewPCG(1, 2))
	for range min(len(sample), reads) {
		w := sample[rng.IntN(len(sample))]
		at, ok := request.IDTime(w.id)
		if !ok {
			return fmt.Errorf("id %s holds no time", w.id)
		}
		start := time.Now()
		got, err := queue.DirectGet(ctx, node.nc, queue.EventStream, map[string]any{
			"next_by_subj": request.EventPrefix + request.EncodeClientID(w.client) + "." + string(request.EventDelivered), "start_time": at.UTC()})
		if err != nil {
			return fmt.Errorf("reference read: %w", err)
		}
		if got == nil {
			return fmt.Errorf("reference read of %s found no delivered event", w.id)
		}
		m.ref = append(m.ref, time.Since(start))
	}
	slices.Sort(m.ref)
	return nil
}

// rows are the figures as the table's rows. They measure a layout on a bare stream, not
// the service: a verdict says whether the layout would meet issue 34's goal, never that
// the service does.
func (m *recordFigures) rows(l recordLayout) []row {
	n, c := m.n, m.c
	label := fmt.Sprintf("%s; %s requests, %s clients (fsync every 2 min)", l.name, thousands(n), thousands(c))
	if m.lag > 0 {
		label += fmt.Sprintf(", each final event after %s more of its client's requests (-record-lag)", thousands(m.lag))
	}
	would := func(ok bool) string {
		if ok {
			return "layout would meet"
		}
		return "layout would miss"
	}
	perRequest := float64(m.heap) / float64(n)
	lat, cold := m.lat, m.cold
	p99 := lat[len(lat)*99/100]
	rows := []row{
		{figure: "record layout (design measurement): subjects in the store; " + label, value: thousands(int(m.subjects)),
			reference: thousands(c) + " clients", ratio: fmt.Sprintf("%.2f", float64(m.subjects)/float64(c)),
			target: "a small multiple of the clients", verdict: would(m.subjects <= uint64(4*c))},
		{figure: "record layout (design measurement): heap per retained request after " + m.idle.String() + " idle; " + label,
			value:     fmt.Sprintf("%.1f B", perRequest),
			reference: fmt.Sprintf("%.0f MiB held for %s requests", float64(m.heap)/(1<<20), thousands(n)), ratio: "-",
			target: "<= 16 B", verdict: would(perRequest <= 16)},
		{figure: "record layout (design measurement): status read p50 / p99; " + label,
			value:     fmt.Sprintf("%s / %s", ms(lat[len(lat)/2]), ms(p99)),
			reference: readsDone(len(lat), m.trips, l.service), ratio: "-",
			target: "p99 <= 10 ms", verdict: would(p99 <= 10*time.Millisecond)},
	}
	if len(m.ref) > 0 {
		refP99 := m.ref[len(m.ref)*99/100]
		ratio := float64(p99) / float64(refP99)
		rows = append(rows, row{figure: "status read p99 ÷ p99 of one next_by_subj direct get of the same requests, same stream; " + label,
			value:     fmt.Sprintf("%s / %s", ms(p99), ms(refP99)),
			reference: fmt.Sprintf("%d reads each", len(m.ref)), ratio: fmt.Sprintf("%.2f", ratio),
			target: "<= 2.0", verdict: map[bool]string{true: "met", false: "MISSED"}[ratio <= 2.0]})
	}
	if !m.settled {
		return rows
	}
	return append(rows,
		row{figure: "record layout (design measurement): heap per retained request after " + m.settle.String() + " idle (blocks' subject state expired; not the target row, which is after " + m.idle.String() + "); " + label,
			value:     fmt.Sprintf("%.1f B", float64(m.settledHeap)/float64(n)),
			reference: fmt.Sprintf("%.0f MiB held for %s requests", float64(m.settledHeap)/(1<<20), thousands(n)), ratio: "-",
			target: "<= 16 B (at " + m.idle.String() + ")", verdict: "-"},
		row{figure: fmt.Sprintf("record layout (design measurement): status read p50 / max of %d cold reads after %s idle, each the first into its stretch of the last hour; %s", coldReads, m.settle, label),
			value:     fmt.Sprintf("%s / %s", ms(cold[len(cold)/2]), ms(cold[len(cold)-1])),
			reference: readsDone(len(cold), m.coldTrips, l.service), ratio: "-",
			target: "p99 <= 10 ms", verdict: would(cold[len(cold)-1] <= 10*time.Millisecond)})
}

// coldReads is how many reads the record scenario makes after the store settled, one
// from each stretch of the last hour.
const coldReads = 40

// idTime is when a request id made by request.NewID was made.
func idTime(id string) (time.Time, error) {
	at, ok := request.IDTime(id)
	if !ok {
		return time.Time{}, fmt.Errorf("id %q holds no time", id)
	}
	return at, nil
}

// heapInUse is the Go heap in use after a collection.
func heapInUse() int64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// thousands writes n with commas between its thousands, as the table does.
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// readsDone says how many reads a row's latencies are of, and their round trips where the
// bench counted them (not through the service's reads).
func readsDone(reads, trips int, service bool) string {
	if service {
		return fmt.Sprintf("%d reads (the service's own; round trips not counted)", reads)
	}
	return fmt.Sprintf("%d reads, %.1f round trips each", reads, float64(trips)/float64(reads))
}
