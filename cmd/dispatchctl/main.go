// Command dispatchctl is the operators' tool: it shows what is queued, stuck or dead,
// replays dead letters, and steers the dispatchers (intervals, pause, resume, purge)
// without a restart. It talks to NATS directly, with the same NATS_URL as the services;
// the dispatcher's admin HTTP API offers the same operations.
//
// Run dispatchctl -h for the commands, dispatchctl <command> -h for one command's flags.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/cmd/internal/cli"
	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/queue"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr))
}

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1 // the command ran and failed
	exitUsage  = 2 // the command line is wrong
)

type command struct {
	name, args, summary string
	flags               func(f *flag.FlagSet, o *opts) // the command's own flags: no environment variables
	minArgs, maxArgs    int
	run                 func(ctx context.Context, e *env, args []string) error
}

// opts holds every command's flags; each command registers the ones it uses.
type opts struct {
	json                             bool
	sort, search                     string
	limit, page                      int
	client, id, reason, since, until string
	all, dryRun, yes, body           bool
	rate, inflight                   string
	wait                             time.Duration
}

// env is what a command runs with.
type env struct {
	o      *opts
	svc    *admin.Service
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	by     string
}

var commands = []command{
	{name: "status", summary: "one screen: queue size, dispatcher instances and the partitions each holds (since when), partitions without an owner, NATS servers, meta and stream leaders, replicas and lag",
		run: status},
	{name: "clients", summary: "list clients with a backlog: count, oldest age, lane state, next send, attempts",
		flags: func(f *flag.FlagSet, o *opts) {
			f.StringVar(&o.sort, "sort", admin.SortBacklog, "order: backlog (largest first), age (oldest first) or next (earliest next send first)")
			f.StringVar(&o.search, "search", "", "only the clients whose id contains this")
			f.IntVar(&o.limit, "limit", 50, "clients per page, 1 to 1000")
			f.IntVar(&o.page, "page", 1, "page to show, from 1")
		}, run: clients},
	{name: "request", args: "<id>", summary: "show where one request is, from its status record: queued (and its place), in flight, delivered, dead-lettered",
		flags: func(f *flag.FlagSet, o *opts) {
			f.StringVar(&o.client, "client", "", "the request's clientId: its status record is read by client, and that client's queue is searched")
		}, minArgs: 1, maxArgs: 1, run: requestState},
	{name: "cancel", args: "<clientId> <id>", summary: "cancel one queued request that is not in flight: it leaves its client's queue unsent, and raven never receives it",
		minArgs: 2, maxArgs: 2, run: cancelRequest},
	{name: "deadletters", summary: "list dead letters, oldest first, with filters",
		flags: func(f *flag.FlagSet, o *opts) {
			filterFlags(f, o)
			f.IntVar(&o.limit, "limit", 100, "most dead letters to list")
			f.BoolVar(&o.body, "body", false, fmt.Sprintf("also show each one's stored headers and body (at most %d; select with -id or -client)", admin.MaxBodies))
		}, run: deadLetters},
	{name: "replay", summary: "put dead letters back at the end of their clients' queues, keeping their ids",
		flags: func(f *flag.FlagSet, o *opts) {
			filterFlags(f, o)
			f.BoolVar(&o.all, "all", false, "replay every dead letter (needed when no filter is given)")
			f.BoolVar(&o.dryRun, "dry-run", false, "list what would be replayed, change nothing")
		}, run: replay},
	{name: "budget", summary: "show raven's budget and each dispatcher's share, effective rate and why it last changed; with -rate or -inflight, change it for every dispatcher",
		flags: func(f *flag.FlagSet, o *opts) {
			f.StringVar(&o.rate, "rate", "", "set the most attempts per second to raven across all dispatchers: a number, none (no limit) or configured (back to RAVEN_MAX_RATE)")
			f.StringVar(&o.inflight, "inflight", "", "set the most attempts in flight to raven across all dispatchers: a number, none or configured (back to RAVEN_MAX_INFLIGHT)")
		}, run: budget},
	{name: "steering", summary: "show the steering in force: global interval, steered clients", run: steering},
	{name: "interval", args: "<duration>|default", summary: "set the global interval for every dispatcher (default: back to DISPATCH_INTERVAL)",
		minArgs: 1, maxArgs: 1, run: globalInterval},
	{name: "client-interval", args: "<clientId> <duration>|default", summary: "give one client its own interval (default: back to the global one)",
		minArgs: 2, maxArgs: 2, run: clientInterval},
	{name: "pause", args: "<clientId>", summary: "stop sends to one client; its requests wait, new ones are still accepted",
		minArgs: 1, maxArgs: 1, run: pause},
	{name: "resume", args: "<clientId>", summary: "let a paused client's requests go again, spaced as usual",
		minArgs: 1, maxArgs: 1, run: resume},
	{name: "purge", args: "<clientId>", summary: "move one client's backlog to the dead-letter stream, unsent (asks for confirmation)",
		flags: func(f *flag.FlagSet, o *opts) {
			f.BoolVar(&o.yes, "yes", false, "do not ask for confirmation")
			f.DurationVar(&o.wait, "wait", 30*time.Second, "how long to wait for the dispatcher to finish the purge (0: do not wait)")
		}, minArgs: 1, maxArgs: 1, run: purge},
}

func filterFlags(f *flag.FlagSet, o *opts) {
	f.StringVar(&o.client, "client", "", "only this clientId's")
	f.StringVar(&o.id, "id", "", "only the request with this id")
	f.StringVar(&o.reason, "reason", "", "only this reason: permanent, attempts_exhausted, age_exhausted, undecodable, purged, expired")
	f.StringVar(&o.since, "since", "", "dead-lettered at or after: RFC 3339 time, or a duration back from now (2h)")
	f.StringVar(&o.until, "until", "", "dead-lettered before: RFC 3339 time, or a duration back from now")
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "Usage: dispatchctl [flags] <command> [flags] [arguments]")
	fmt.Fprintln(w, "\nCommands:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s %s\t%s\n", c.name, c.args, c.summary)
	}
	tw.Flush()
	fmt.Fprintln(w, "\nEvery command takes -nats-url [NATS_URL], -timeout and -json, before or after its name;")
	fmt.Fprintln(w, "a command's own flags go after its name. dispatchctl <command> -h shows its flags.")
	fmt.Fprintln(w, "Exit status: 0 done, 1 the command failed, 2 the command line is wrong.")
}

// globals are the settings every command takes, before its name or after it.
type globals struct {
	logs              *cli.Log
	nats              *cli.NATS
	timeout, laneWait time.Duration
}

// globalSettings registers the settings every command takes on s.
func globalSettings(s *cli.Settings, o *opts) *globals {
	g := &globals{logs: cli.LogSettings(s), nats: cli.NATSSettings(s, queue.RoleOps)}
	s.Flags().DurationVar(&g.timeout, "timeout", time.Minute, "bound on the whole command")
	cli.LaneWaitSetting(s, &g.laneWait, admin.DefaultLaneWait)
	s.Flags().BoolVar(&o.json, "json", false, "print JSON instead of a table")
	return g
}

// commandFirst moves the flags given before the command's name (dispatchctl -nats-url
// URL status) to just after it, where the command reads them with its own flags: it
// returns the command's name and what follows it. Only the flags every command takes may
// come first; each takes the next argument as its value unless it is boolean or written
// -flag=value. -h among them asks for the usage (flag.ErrHelp).
func commandFirst(args []string) (name string, rest []string, err error) {
	s := cli.NewSettings("dispatchctl", func(string) string { return "" }, io.Discard)
	globalSettings(s, &opts{})
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") || a == "-" {
			return a, append(slices.Clone(args[:i]), args[i+1:]...), nil
		}
		fname, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if fname == "h" || fname == "help" {
			return "", nil, flag.ErrHelp
		}
		f := s.Flags().Lookup(fname)
		if f == nil {
			return "", nil, fmt.Errorf("%s before the command is not a flag every command takes (give a command's own flags after its name)", a)
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !hasValue && !(ok && b.IsBoolFlag()) {
			if i++; i == len(args) { // its value
				return "", nil, fmt.Errorf("%s needs a value", a)
			}
		}
	}
	return "", nil, errors.New("no command given after the flags")
}

func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || args[0] == "help" {
		usage(stdout)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	name, args, err := commandFirst(args)
	if errors.Is(err, flag.ErrHelp) {
		usage(stdout)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "dispatchctl: %v\n\n", err)
		usage(stderr)
		return exitUsage
	}
	var cmd *command
	for i := range commands {
		if commands[i].name == name {
			cmd = &commands[i]
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "dispatchctl: unknown command %q\n\n", name)
		usage(stderr)
		return exitUsage
	}
	o := &opts{}
	s := cli.NewSettings("dispatchctl "+cmd.name, getenv, stderr)
	s.SetUsage(stderr, fmt.Sprintf("Usage: dispatchctl %s [flags] %s\n\n%s.", cmd.name, cmd.args, cmd.summary))
	g := globalSettings(s, o)
	logs, natsCfg := g.logs, g.nats
	if cmd.flags != nil {
		cmd.flags(s.Flags(), o)
	}
	rest, err := s.ParseWithArgs(args, cmd.minArgs, cmd.maxArgs, "arguments "+cmd.args)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err == nil && g.timeout <= 0 {
		err = fmt.Errorf("-timeout %s: give a positive duration (1m by default)", g.timeout)
	}
	if err != nil {
		fmt.Fprintln(stderr, "dispatchctl:", err)
		return exitUsage
	}
	log := zerolog.Nop()
	if logs.Level == "debug" {
		log = logs.Logger(stderr, "dispatchctl")
	}
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	svc, closeConn, err := openService(ctx, natsCfg, g.laneWait, log)
	if err != nil {
		fmt.Fprintln(stderr, "dispatchctl:", err)
		if errors.Is(err, queue.ErrUnreachable) || errors.Is(err, queue.ErrRefused) {
			fmt.Fprintln(stderr, "(NATS_URL, NATS_USER and NATS_PASSWORD say where and as whom; a standalone dispatcher takes NATS clients only when started with NATS_LISTEN=127.0.0.1:4222; for the compose stack, see the README's docker-compose section)")
		}
		return exitFailed
	}
	defer closeConn()
	e := &env{o: o, svc: svc, stdin: stdin, stdout: stdout, stderr: stderr, by: operator()}
	if err := cmd.run(ctx, e, rest); err != nil {
		fmt.Fprintf(stderr, "dispatchctl %s: %v\n", cmd.name, err)
		if errors.Is(err, admin.ErrInvalid) {
			return exitUsage
		}
		return exitFailed
	}
	return exitOK
}

// openService connects to NATS and opens the admin service over the existing streams
// and buckets. closeConn closes the connection.
func openService(ctx context.Context, natsCfg *cli.NATS, laneWait time.Duration, log zerolog.Logger) (svc *admin.Service, closeConn func(), err error) {
	nc, err := natsCfg.ConnectOnce("dispatchctl")
	if err != nil {
		return nil, nil, err
	}
	q, err := nc.Open(ctx, queue.Config{}, queue.Existing)
	if err == nil {
		var ctl *queue.Control
		if ctl, err = q.Control(ctx, log); err == nil {
			svc, err = admin.New(admin.Config{Queue: q, Control: ctl, Log: log, LaneWait: laneWait})
		}
	} else {
		err = fmt.Errorf("NATS_URL=%s: %w", queue.RedactURLs(natsCfg.URL), err)
	}
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return svc, nc.Close, nil
}

// operator names who ran the command, for the steering record and the dispatchers' log.
func operator() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return "dispatchctl " + name + "@" + host
}

func (e *env) print(v any, table func(w *tabwriter.Writer)) error {
	if e.o.json {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false) // a detail's <token> stays <token>, as the APIs answer it
		return enc.Encode(v)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

func clients(ctx context.Context, e *env, _ []string) error {
	page, err := e.svc.Clients(ctx, admin.ClientsQuery{Sort: e.o.sort, Limit: e.o.limit, Page: e.o.page, Search: e.o.search})
	if err != nil {
		return err
	}
	return e.print(page, func(w *tabwriter.Writer) { printClients(w, page) })
}

// printClients writes a page of clients as a table, and says which page of how many it
// is; with no client to show, it says so instead.
func printClients(w io.Writer, page admin.ClientsPage) {
	matching := ""
	if page.Search != "" {
		matching = fmt.Sprintf(" whose id contains %s", quote(page.Search))
	}
	if page.Total == 0 {
		fmt.Fprintf(w, "no client%s has a backlog\n", matching)
		return
	}
	if len(page.Clients) > 0 {
		fmt.Fprintf(w, "CLIENT\tBACKLOG\tOLDEST AGE\tLANE\tNEXT SEND\tATTEMPTS\tINTERVAL\tSTEERING\n")
		for _, c := range page.Clients {
			fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s\n", quote(c.ClientID), c.Backlog, dash(c.OldestAge), c.Lane,
				relative(c.NextSend), c.Attempts, dash(c.Interval), steerText(c.Steering))
		}
	}
	pages := (page.Total + page.Limit - 1) / max(page.Limit, 1)
	fmt.Fprintf(w, "%s%s with a backlog (page %d of %d, %d per page, by %s)\n",
		admin.Count(page.Total, "client", "clients"), matching, page.Page, pages, page.Limit, page.Sort)
	for _, p := range page.Problems {
		fmt.Fprintf(w, "could not read %s: its clients' lanes are missing above\n", p)
	}
}

func requestState(ctx context.Context, e *env, args []string) error {
	rs, err := e.svc.Request(ctx, args[0], e.o.client)
	if err != nil {
		return err
	}
	return e.print(rs, func(w *tabwriter.Writer) { printRequest(w, rs) })
}

// cancelRequest asks the dispatcher that owns the client to cancel the request.
func cancelRequest(ctx context.Context, e *env, args []string) error {
	out, err := e.svc.Cancel(ctx, args[0], args[1])
	if err != nil {
		return err
	}
	return e.print(out, func(w *tabwriter.Writer) {
		fmt.Fprintf(w, "id\t%s\nstate\t%s\ndetail\t%s\n", printable(args[1]), out.State, printable(out.Detail))
		if r := out.Record; r != nil && !r.CancelledAt.IsZero() {
			fmt.Fprintf(w, "cancelled at\t%s\n", r.CancelledAt.Format(time.RFC3339Nano))
		}
	})
}

// printRequest writes where a request is, a line for each fact known.
func printRequest(w io.Writer, rs admin.RequestState) {
	fmt.Fprintf(w, "id\t%s\nstate\t%s\ndetail\t%s\n", printable(rs.ID), rs.State, printable(rs.Detail))
	if rs.ClientID != "" {
		fmt.Fprintf(w, "client\t%s\n", quote(rs.ClientID))
	}
	if !rs.AcceptedAt.IsZero() {
		fmt.Fprintf(w, "accepted at\t%s\n", rs.AcceptedAt.Format(time.RFC3339Nano))
	}
	if rs.Position != nil {
		fmt.Fprintf(w, "requests ahead\t%d\n", *rs.Position)
	}
	if rs.Lane != nil {
		fmt.Fprintf(w, "lane\t%s on %s, next send %s, %s, interval %s\n", rs.Lane.State, rs.Dispatcher, relative(rs.Lane.NextSend),
			admin.Count(rs.Lane.Attempts, "failed attempt", "failed attempts"), rs.Lane.Interval)
	}
	if d := rs.Delivery; d != nil {
		fmt.Fprintf(w, "delivered at\t%s on %s, attempt %d\n", d.Delivered.Format(time.RFC3339Nano), rs.Dispatcher, d.Attempt)
	}
	if d := rs.DeadLetter; d != nil {
		fmt.Fprintf(w, "reason\t%s\nattempts\t%d\nlast status\t%d\nlast error\t%s\ndead at\t%s\n", d.Reason, d.Attempts, d.LastStatus, lastError(d.Verdict), d.DeadAt.Format(time.RFC3339Nano))
	}
	if r := rs.Record; r != nil {
		fmt.Fprintf(w, "record\t%s, %s, %s, updated %s\n", r.State, admin.Count(r.Attempts, "attempt", "attempts"),
			admin.Count(r.Replays, "replay", "replays"), r.UpdatedAt.Format(time.RFC3339Nano))
		if a := r.LastAttempt; a != nil {
			fmt.Fprintf(w, "last attempt\t%s, status %d %s\n", a.At.Format(time.RFC3339Nano), a.Status, printable(a.Error))
		}
		if !r.NotBefore.IsZero() {
			fmt.Fprintf(w, "not before\t%s\n", r.NotBefore.Format(time.RFC3339Nano))
		}
	}
}

// relative says how soon t is, rounded as a person reads it ("in 59s"); "now" once it
// has passed.
func relative(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Until(t)
	if d <= 0 {
		return "now"
	}
	return "in " + admin.Age(d)
}

// quote shows an id (a clientId, an instance) safely: quoted when it holds spaces or
// quotes, and any control character escaped, so that it cannot steer the terminal; and
// quoted, escaped, when it holds an invisible format character (a zero-width space:
// "ali\u200bce" would look like "alice").
func quote(s string) string {
	if s == "" {
		return "-"
	}
	if strings.ContainsAny(s, " \t\"") || printable(s) != s || strings.ContainsFunc(s, isFormat) {
		return strconv.QuoteToASCII(s)
	}
	return s
}

// isFormat reports an invisible format character (Unicode's Cf: zero-width spaces and
// joiners, byte order marks, bidi controls).
func isFormat(r rune) bool { return unicode.Is(unicode.Cf, r) }

func dash(s string) string { return orText(s, "-") }

func orText(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
