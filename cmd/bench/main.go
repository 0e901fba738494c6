// Command bench measures the service against references taken in the same run, and
// prints one table: each figure with its reference, the ratio and the target.
//
//	go run ./cmd/bench             # the full run (several minutes)
//	go run ./cmd/bench -quick      # a short smoke run: every row, small numbers
//
// It starts everything it needs itself: an embedded JetStream server (a fresh one per
// scenario), the ingest API and the dispatcher in this process, and a fast raven on
// loopback. Absolute figures drift on shared machines; the ratios are measured side by
// side and drift less. Targets are printed, never asserted: this is not a test.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) > 1 && os.Args[1] == "loadgen" {
		if err := loadgenMain(ctx, os.Args[2:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "bench loadgen:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "bench:", err)
		}
		os.Exit(1)
	}
}

// settings are the bench's knobs; -quick shrinks them for a smoke run.
type settings struct {
	quick          bool
	only           string
	blockProfile   string // where to write the block profile; none when empty
	ingestFor      time.Duration
	ingestRounds   int
	ingestKinds    []string
	dispatchFor    time.Duration
	interval       time.Duration
	dispatchN      []int
	idleRequests   int
	distinct       int
	laneMemClients int
	recordRequests int
	recordClients  int
	recordIdle     time.Duration
	recordSettle   time.Duration
	recordLag      int
	recordLayouts  string
	recordReads    int // random status reads of each record layout
}

// row is one line of the table.
type row struct {
	figure, value, reference, ratio, target, verdict string
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	s, cpuProfile, err := parseSettings(args, stderr)
	if err != nil {
		return err
	}
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if s.blockProfile != "" {
		blockProfileRate = int(100 * time.Microsecond) // set again after each server's start
		runtime.SetBlockProfileRate(blockProfileRate)
		defer writeProfile("block", s.blockProfile, stderr)
	}
	want := func(name string) bool { return s.only == "" || strings.Contains(","+s.only+",", ","+name+",") }

	fmt.Fprintf(stderr, "bench: %d cores, GOMAXPROCS %d, %s\n", runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())
	var rows []row
	var stepErr error
	add := func(r []row, err error) error {
		rows = append(rows, r...)
		return err
	}
	steps := []struct {
		name string
		f    func() ([]row, error)
	}{
		{"ingest", func() ([]row, error) { return benchIngest(ctx, s, stderr) }},
		{"batch", func() ([]row, error) { return benchBatch(ctx, s, stderr) }},
		{"dispatch", func() ([]row, error) { return benchDispatch(ctx, s, stderr) }},
		{"events", func() ([]row, error) { return benchEvents(ctx, s, stderr) }},
		{"idle", func() ([]row, error) { return benchIdle(ctx, s, stderr) }},
		{"memory", func() ([]row, error) { return benchLaneMemory(s) }},
		{"distinct", func() ([]row, error) { return benchDistinct(ctx, s, stderr) }},
		{"budget", func() ([]row, error) { return benchBudget(ctx, s, stderr) }},
		{"console", func() ([]row, error) { return benchConsole(ctx, s, stderr) }},
		{"tracing", func() ([]row, error) { return benchTracing(ctx, s, stderr) }},
		{"reads", func() ([]row, error) { return benchReads(ctx, s, stderr) }},
		{"record", func() ([]row, error) { return benchRecord(ctx, s, stderr) }},
		{"watch", func() ([]row, error) { return benchWatch(ctx, s, stderr) }},
	}
	for _, st := range steps {
		if !want(st.name) {
			continue
		}
		settle()
		fmt.Fprintf(stderr, "bench: %s ...\n", st.name)
		if err := add(st.f()); err != nil {
			// The table still shows what was measured before (and beside) the failure.
			stepErr = fmt.Errorf("%s: %w", st.name, err)
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}

	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tvalue\treference\tratio\ttarget\tverdict")
	fmt.Fprintln(tw, "------\t-----\t---------\t-----\t------\t-------")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.figure, r.value, r.reference, r.ratio, r.target, r.verdict)
	}
	return errors.Join(tw.Flush(), stepErr)
}

// parseSettings reads the bench's flags into its settings; -quick shrinks them.
func parseSettings(args []string, stderr io.Writer) (s settings, cpuProfile string, err error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&s.quick, "quick", false, "a short smoke run: every row, small numbers")
	fs.StringVar(&s.only, "only", "", "run only these scenarios, comma-separated: ingest, batch, dispatch, events, idle, memory, distinct, budget, console, tracing, reads, record, watch")
	fs.IntVar(&s.distinct, "distinct", 1_000_000, "distinct clientIds sent through in the distinct scenario")
	fs.IntVar(&s.recordRequests, "record-requests", 10_000_000, "requests retained in the record scenario")
	fs.IntVar(&s.recordClients, "record-clients", 100_000, "clients those requests are spread over in the record scenario")
	fs.StringVar(&s.recordLayouts, "record-layouts", "", "in the record scenario, measure only the layouts numbered so, comma-separated, in the order the table lists them (1: ADR 8's); all when empty")
	fs.IntVar(&s.recordLag, "record-lag", 0, "in the record scenario, how many of its client's requests come before each request's final event (a backlogged client); 0: it follows its acceptance at once")
	clients := fs.Int("clients", 0, "backlogged clients in the dispatch scenario (default: 1000 and 10000)")
	cpuProfileFlag := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	fs.StringVar(&s.blockProfile, "blockprofile", "", "write a profile of where goroutines waited (blocking events of 100 us and more, sampled) over the whole run to this file")
	kinds := fs.String("kinds", "", "in the ingest scenario, measure only these servers, comma-separated (raw, bare, minimal, ingest, ingest-no-events, h2c), and print their figures without the table's rows; with -cpuprofile, to profile one alone")
	if err := fs.Parse(args); err != nil {
		return s, "", err
	}
	s.ingestFor, s.dispatchFor, s.interval = 5*time.Second, 30*time.Second, 5*time.Second
	s.ingestRounds = 5
	s.dispatchN, s.idleRequests, s.laneMemClients = []int{1000, 10000}, 500, 10000
	if s.quick {
		s.ingestFor, s.dispatchFor, s.interval = time.Second, 3*time.Second, time.Second
		s.ingestRounds = 1
		s.dispatchN, s.idleRequests, s.laneMemClients = []int{200}, 50, 2000
		s.distinct = min(s.distinct, 5000)
		s.recordRequests, s.recordClients = min(s.recordRequests, 20_000), min(s.recordClients, 200)
	}
	s.recordIdle, s.recordSettle, s.recordReads = 30*time.Second, 150*time.Second, 1000
	if s.quick {
		s.recordIdle, s.recordSettle, s.recordReads = time.Second, 0, 100
		settlePause = 200 * time.Millisecond
	}
	if *kinds != "" {
		for _, k := range strings.Split(*kinds, ",") {
			kind, ok := kindNames[k]
			if !ok {
				return s, "", fmt.Errorf("-kinds: %q is none of raw, bare, minimal, ingest, ingest-no-events, h2c", k)
			}
			s.ingestKinds = append(s.ingestKinds, kind)
		}
	}
	if *clients > 0 {
		s.dispatchN = []int{*clients}
	}
	return s, *cpuProfileFlag, nil
}

// settle lets the machine calm down between scenarios: dirty pages that an earlier
// scenario left to the kernel would otherwise be written back while the next one fsyncs,
// and its fsyncs would wait behind them.
func settle() {
	syscall.Sync()
	runtime.GC()
	time.Sleep(settlePause)
}

// settlePause is how long settle waits after the sync: a second, shorter in a -quick
// smoke run, whose figures are not compared.
var settlePause = time.Second

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

// blockProfileRate is the block profile's rate (-blockprofile); 0 when off. A NATS
// server's start sets the process's rate to its own option (0), so each node sets it
// again.
var blockProfileRate int

// writeProfile writes the runtime profile name to file, saying on log when it cannot.
func writeProfile(name, file string, log io.Writer) {
	f, err := os.Create(file)
	if err == nil {
		err = pprof.Lookup(name).WriteTo(f, 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(log, "bench: writing the %s profile: %v\n", name, err)
	}
}
