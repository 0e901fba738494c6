// Command soak runs the whole service as separate processes (a 3-node NATS cluster of
// natsnodes, 2 ingests, 3 dispatchers) under penguin-like load, and applies a seeded
// schedule of every fault the service is tested against, one at a time, timing each
// recovery. At the end it waits for the backlog to drain, checks what the recording raven
// received against the guarantees, and prints one table. It exits 1 when a guarantee
// broke or a fault was not recovered from.
//
//	go run ./cmd/soak -for 30m -seed 7
//
// The disk-full fault needs root (each node's store is a small tmpfs); without it that
// fault is left out, and the run says so.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/penguinhq/dispatcher/integration/itest"
	"github.com/penguinhq/dispatcher/pkg/fault"
	"github.com/penguinhq/dispatcher/pkg/ledger"
	"github.com/penguinhq/dispatcher/pkg/queue"
)

func main() {
	// Ctrl-C ends the run early but cleanly: the processes stopped, the file systems
	// unmounted.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop) // a second Ctrl-C ends it at once
	err := runSoak(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "soak:", err)
		}
		os.Exit(1)
	}
}

type flags struct {
	duration, interval time.Duration
	seed               uint64
	clients            int
	bin, keep          string
	recoveryBound      time.Duration
}

func parseFlags(args []string, out io.Writer) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.DurationVar(&f.duration, "for", time.Minute, "how long faults are applied (the drain at the end comes on top)")
	fs.Uint64Var(&f.seed, "seed", uint64(time.Now().UnixNano()), "seed of the fault schedule and the load; the run prints it")
	fs.DurationVar(&f.interval, "interval", 500*time.Millisecond, "DISPATCH_INTERVAL of the run")
	fs.IntVar(&f.clients, "clients", 40, "penguin clients posting at once")
	fs.StringVar(&f.bin, "bin", "", "directory with built natsnode, ingest and dispatcher binaries (default: build them)")
	fs.StringVar(&f.keep, "keep", "", "keep the logs and stores here instead of a temporary directory")
	fs.DurationVar(&f.recoveryBound, "recovery-bound", 90*time.Second, "longest a recovery may take before the fault counts as not recovered from")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	return f, nil
}

func runSoak(ctx context.Context, args []string, out io.Writer) error {
	f, err := parseFlags(args, out)
	if err != nil {
		return err
	}
	dir := f.keep
	failed := true // until the run says otherwise: a failed run's logs are kept
	if dir == "" {
		if dir, err = os.MkdirTemp("", "soak-"); err != nil {
			return err
		}
		// Deferred first, so it runs last: after the processes stopped and the file
		// systems were unmounted.
		defer func() {
			if !failed {
				os.RemoveAll(dir)
			}
		}()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	bin, err := build(f.bin, dir, out)
	if err != nil {
		return err
	}
	s := &soak{run: run{dir: dir, ingestBin: filepath.Join(bin, "ingest"), dispatchBin: filepath.Join(bin, "dispatcher"),
		interval: f.interval, ravenTimeout: time.Second, leaseTTL: 3 * time.Second},
		rng: rand.New(rand.NewPCG(f.seed, f.seed>>1|1)), stats: map[string]*faultStat{}}
	defer s.close()
	bases, err := s.setUp(ctx, f, filepath.Join(bin, "natsnode"), out)
	if err != nil {
		return err
	}
	if err := s.faults(ctx, f, bases); err != nil {
		return err
	}
	fmt.Fprintf(out, "[%6.1fs] load stopped; waiting for the backlog to drain\n", time.Since(s.start).Seconds())
	drained := s.drain(ctx)
	drainedAt := time.Since(s.start)
	// Before the dispatchers stop: a final event they keep is written by them (ADR 9).
	s.load.mu.Lock()
	accepted := append([]ledger.Accepted(nil), s.load.accepted...)
	s.load.mu.Unlock()
	statusesRead, brokenStatuses := finalStatuses(bases, accepted, s.delivered(), deadLetters(s.q))
	for _, d := range s.dispatchers {
		d.p.Stop(syscall.SIGTERM, 20*time.Second)
	}
	failed = s.verdict(out, f, drainedAt)
	s.load.mu.Lock()
	fmt.Fprintf(out, "status reads during the load: %v; after the drain, %d of %d accepted requests read (a sample) say other than raven and the dead letters\n", s.load.reads, len(brokenStatuses), statusesRead)
	s.load.mu.Unlock()
	for _, b := range brokenStatuses {
		fmt.Fprintln(out, "guarantee broken:", b)
		failed = true
	}
	if drained != nil {
		fmt.Fprintf(out, "the backlog did not drain within 5 minutes after the load stopped\n")
		failed = true
	}
	if failed {
		fmt.Fprintf(out, "FAILED (logs kept in %s; rerun with -seed %d)\n", dir, f.seed)
		return errors.New("a guarantee broke or a fault was not recovered from")
	}
	fmt.Fprintln(out, "PASSED")
	return nil
}

// build builds the binaries the soak runs into dir/bin, unless bin names where they are.
func build(bin, dir string, out io.Writer) (string, error) {
	if bin != "" {
		return bin, nil
	}
	bin = filepath.Join(dir, "bin")
	fmt.Fprintln(out, "building natsnode, ingest and dispatcher")
	return bin, itest.Build(bin, out, "natsnode", "ingest", "dispatcher")
}

// setUp starts the cluster, the recording raven behind its fault proxy, two ingests and
// three dispatchers, and waits until they are ready. It returns the ingests' base URLs.
func (s *soak) setUp(ctx context.Context, f flags, natsnode string, out io.Writer) (bases []string, err error) {
	tmpfsSize := 0
	if s.diskFaults = fault.CanMount(); s.diskFaults {
		tmpfsSize = 512 << 20
	} else {
		fmt.Fprintln(out, "not root: the disk-full fault is left out (it mounts a small tmpfs per node)")
	}
	fmt.Fprintf(out, "soak: seed %d, faults for %s, interval %s, %d clients, commit %s, logs in %s\n", f.seed, f.duration, f.interval, f.clients, commit(), s.dir)
	if s.c, err = startCluster(s.dir, natsnode, tmpfsSize); err != nil {
		return nil, err
	}
	octx, cancel := context.WithTimeout(ctx, time.Minute)
	s.q, err = s.c.openQueue(octx, queue.Config{Replicas: 3})
	cancel()
	if err != nil {
		return nil, err
	}
	if s.leases, err = s.q.Leases(context.Background(), s.leaseTTL); err != nil {
		return nil, err
	}
	if err := s.startRaven(); err != nil {
		return nil, err
	}
	for slot := range 2 {
		i, err := s.startIngest(s.c, slot+1)
		if err != nil {
			return nil, err
		}
		s.ingests = append(s.ingests, i)
		bases = append(bases, "http://"+i.addr)
	}
	for slot := range 3 {
		d, err := s.startDispatcher(s.c, slot, 1)
		if err != nil {
			return nil, err
		}
		s.dispatchers = append(s.dispatchers, d)
	}
	if err := waitUntil(ctx, time.Minute, func() bool {
		for _, sv := range s.services() {
			if !sv.p.ready() {
				return false
			}
		}
		return true
	}); err != nil {
		return nil, fmt.Errorf("the services did not become ready: %w", err)
	}
	return bases, nil
}

// startRaven starts the recording raven behind a fault proxy.
func (s *soak) startRaven() error {
	s.raven = ledger.New(ledger.Options{Respond: s.respond})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	s.ravenSrv = &http.Server{Handler: s.raven, ConnContext: s.raven.ConnContext}
	go func() { _ = s.ravenSrv.Serve(ln) }()
	if s.ravenProxy, err = fault.New(ln.Addr().String()); err != nil {
		return err
	}
	s.ravenURL = "http://" + s.ravenProxy.Addr()
	return nil
}

func (s *soak) services() []*service {
	return append(append([]*service{}, s.dispatchers...), s.ingests...)
}

// close stops what setUp started, in reverse.
func (s *soak) close() {
	for _, sv := range s.services() {
		sv.close()
	}
	if s.ravenProxy != nil {
		s.ravenProxy.Close()
	}
	if s.ravenSrv != nil {
		s.ravenSrv.Close()
	}
	if s.c != nil {
		s.c.close()
	}
}

// faults puts the load on and applies faults, one at a time, for the run's duration.
func (s *soak) faults(ctx context.Context, f flags, bases []string) error {
	s.start = time.Now()
	s.load = startLoad(bases, f.clients, f.interval, f.seed)
	defer s.load.halt()
	time.Sleep(3 * time.Second) // a backlog before the first fault
	kinds := s.kinds()
	for time.Since(s.start) < f.duration {
		if err := s.faultRound(ctx, kinds, f.recoveryBound); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.New("interrupted")
		case <-time.After(time.Duration(500+s.rng.IntN(1500)) * time.Millisecond):
		}
	}
	return nil
}

// drain waits up to 5 minutes for every accepted request to be delivered or
// dead-lettered.
func (s *soak) drain(ctx context.Context) error {
	return waitUntil(ctx, 5*time.Minute, func() bool {
		st, err := s.q.Stats(context.Background())
		if err != nil || st.Requests != 0 {
			return false
		}
		dead, got := deadLetters(s.q), s.delivered()
		s.load.mu.Lock()
		defer s.load.mu.Unlock()
		for _, a := range s.load.accepted {
			if !got[a.ID] && !dead[a.ID] {
				return false
			}
		}
		return true
	})
}

// delivered is the ids raven answered 2xx for.
func (s *soak) delivered() map[string]bool {
	ids := map[string]bool{}
	for _, a := range s.raven.Arrivals() {
		if a.Status >= 200 && a.Status < 300 && a.StatusSent {
			ids[a.ID] = true
		}
	}
	return ids
}

// verdict checks what raven received against the guarantees and prints the report; it
// says whether the run failed.
func (s *soak) verdict(out io.Writer, f flags, drainedAt time.Duration) (failed bool) {
	dead := deadLetters(s.q)
	causes, timedOut := s.explain()
	explained := map[string]bool{}
	for id := range causes {
		explained[id] = true
	}
	s.load.mu.Lock()
	accepted := append([]ledger.Accepted(nil), s.load.accepted...)
	statuses, retries, unexpected := s.load.statuses, s.load.retries, s.load.unexpected
	s.load.mu.Unlock()
	arrivals := s.raven.Arrivals()
	rep := ledger.Check(arrivals, ledger.Expect{Interval: f.interval, Accepted: accepted, Dead: dead,
		AllowUnacknowledged: true, Explained: explained, TimedOut: timedOut})
	if len(rep.Violations) > 0 {
		s.keepArrivals(out, arrivals, rep)
	}
	return s.report(out, f, rep, causes, len(accepted), statuses, retries, unexpected, drainedAt)
}

// keepArrivals writes, beside the logs, every arrival of the clients a violation names
// and of the requests delivered twice, so that a failed run can be looked into: one JSON
// line each, after a line with the run's start (the faults' times count from it).
func (s *soak) keepArrivals(out io.Writer, arrivals []ledger.Arrival, rep ledger.Report) {
	clients := map[string]bool{}
	for _, v := range rep.Violations {
		if _, rest, ok := strings.Cut(v, `client "`); ok {
			if c, _, ok := strings.Cut(rest, `"`); ok {
				clients[c] = true
			}
		}
	}
	dup := map[string]bool{}
	for _, id := range rep.DuplicateIDs {
		dup[id] = true
	}
	path := filepath.Join(s.dir, "arrivals.jsonl")
	fh, err := os.Create(path)
	if err != nil {
		fmt.Fprintln(out, "keeping the arrivals:", err)
		return
	}
	defer fh.Close()
	enc := json.NewEncoder(fh)
	_ = enc.Encode(map[string]any{"start": s.start})
	for _, a := range arrivals {
		if clients[a.ClientID] || dup[a.ID] {
			a.Body = nil
			_ = enc.Encode(a)
		}
	}
	fmt.Fprintln(out, "arrivals of the clients in question:", path)
}

func deadLetters(q *queue.Queue) map[string]bool {
	ids := map[string]bool{}
	for r, err := range q.DeadLetters(context.Background(), queue.DeadFilter{}) {
		if err != nil {
			break
		}
		ids[r.ID] = true
	}
	return ids
}

func (s *soak) report(out io.Writer, f flags, rep ledger.Report, causes map[string]string, accepted int,
	statuses map[int]int, retries int, unexpected []string, drained time.Duration) (failed bool) {
	fmt.Fprintf(out, "\nseed %d, faults for %s, drained at %s, interval %s, %d clients, %s/%s, %d cores\n\n",
		f.seed, f.duration, drained.Round(time.Second), f.interval, f.clients, runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	byCause := map[string]int{}
	unexplained := 0
	for _, id := range rep.DuplicateIDs {
		if c, ok := causes[id]; ok {
			byCause[c]++
		} else {
			unexplained++
		}
	}
	var dups []string
	for c, n := range byCause {
		dups = append(dups, fmt.Sprintf("%d %s", n, c))
	}
	sort.Strings(dups)
	if unexplained > 0 {
		dups = append(dups, fmt.Sprintf("%d UNEXPLAINED", unexplained))
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "accepted\tdelivered\tdead-lettered\tlost\tgaps below the interval\tmost in flight for one client\tduplicates")
	fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\t%d (%s)\n", accepted, rep.Delivered, rep.Dead, rep.Lost, rep.ShortGaps, rep.MaxInFlight,
		rep.Duplicates, strings.Join(dups, ", "))
	tw.Flush()
	fmt.Fprintf(out, "\ningest answers: %v (retried by the load: %d); raven arrivals: %d, never acknowledged to the caller: %d\n\n",
		statuses, retries, rep.Arrivals, rep.Unacknowledged)
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "fault\ttimes\tlongest from its end to full recovery")
	for _, name := range s.faultNames() {
		st := s.stats[name]
		longest := st.longest.Round(10 * time.Millisecond).String()
		if st.failures > 0 {
			longest = fmt.Sprintf("NOT RECOVERED %d times", st.failures)
			failed = true
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\n", name, st.count, longest)
	}
	tw.Flush()
	for _, v := range rep.Violations {
		fmt.Fprintln(out, "guarantee broken:", v)
	}
	for _, u := range unexpected {
		fmt.Fprintln(out, "unexpected answer from ingest:", u)
	}
	return failed || len(rep.Violations) > 0 || rep.Lost > 0 || rep.ShortGaps > 0 || rep.MaxInFlight > 1 || len(unexpected) > 0
}

// waitUntil polls cond every 100 ms until it holds, d passes or ctx ends.
func waitUntil(ctx context.Context, d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", d)
		}
		select {
		case <-ctx.Done():
			return errors.New("interrupted")
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// commit is the checked-out commit, as the run's report names it.
func commit() string {
	b, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(b))
	if exec.Command("git", "diff", "--quiet", "HEAD").Run() != nil {
		c += " with changes"
	}
	return c
}
