// Command dispatchctl is the operators' tool: it shows what is queued, stuck or dead,
// replays dead letters, and steers the dispatchers (intervals, pause, resume, purge)
// without a restart. It talks to NATS directly, with the same NATS_URL as the services;
// the dispatcher's admin HTTP API offers the same operations.
//
// Run dispatchctl -h for the commands, dispatchctl <command> -h for one command's flags.
package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
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
	"unicode/utf8"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/cmd/internal/cli"
	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
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
	sort                             string
	limit, page                      int
	client, id, reason, since, until string
	all, dryRun, yes, body           bool
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
			f.StringVar(&o.sort, "sort", admin.SortBacklog, "order: backlog (largest first) or age (oldest first)")
			f.IntVar(&o.limit, "limit", 50, "clients per page, 1 to 1000")
			f.IntVar(&o.page, "page", 1, "page to show, from 1")
		}, run: clients},
	{name: "request", args: "<id>", summary: "show where one request is: queued (and its place), in flight, sent, dead-lettered",
		flags: func(f *flag.FlagSet, o *opts) {
			f.StringVar(&o.client, "client", "", "the request's clientId: searches only its queue, much faster")
		}, minArgs: 1, maxArgs: 1, run: requestState},
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
	f.StringVar(&o.reason, "reason", "", "only this reason: permanent, attempts-exhausted, age-exhausted, undecodable, purged")
	f.StringVar(&o.since, "since", "", "dead-lettered at or after: RFC 3339 time, or a duration back from now (2h)")
	f.StringVar(&o.until, "until", "", "dead-lettered before: RFC 3339 time, or a duration back from now")
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "Usage: dispatchctl <command> [flags] [arguments]")
	fmt.Fprintln(w, "\nCommands:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s %s\t%s\n", c.name, c.args, c.summary)
	}
	tw.Flush()
	fmt.Fprintln(w, "\nEvery command takes -nats-url [NATS_URL] and -json; dispatchctl <command> -h shows its flags.")
	fmt.Fprintln(w, "Exit status: 0 done, 1 the command failed, 2 the command line is wrong.")
}

func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	var cmd *command
	for i := range commands {
		if commands[i].name == args[0] {
			cmd = &commands[i]
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "dispatchctl: unknown command %q\n\n", args[0])
		usage(stderr)
		return exitUsage
	}
	o := &opts{}
	s := cli.NewSettings("dispatchctl "+cmd.name, getenv, stderr)
	s.SetUsage(stderr, fmt.Sprintf("Usage: dispatchctl %s [flags] %s\n\n%s.", cmd.name, cmd.args, cmd.summary))
	logs := cli.LogSettings(s)
	natsCfg := cli.NATSSettings(s)
	var timeout time.Duration
	s.Flags().DurationVar(&timeout, "timeout", time.Minute, "bound on the whole command")
	s.Flags().BoolVar(&o.json, "json", false, "print JSON instead of a table")
	if cmd.flags != nil {
		cmd.flags(s.Flags(), o)
	}
	rest, err := s.ParseWithArgs(args[1:], cmd.minArgs, cmd.maxArgs, "arguments "+cmd.args)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "dispatchctl:", err)
		return exitUsage
	}
	log := zerolog.Nop()
	if logs.Level == "debug" {
		log = logs.Logger(stderr, "dispatchctl")
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	nc, err := natsCfg.ConnectOnce("dispatchctl")
	if err != nil {
		fmt.Fprintln(stderr, "dispatchctl:", err)
		if errors.Is(err, queue.ErrUnreachable) || errors.Is(err, queue.ErrRefused) {
			fmt.Fprintln(stderr, "(NATS_URL, NATS_USER and NATS_PASSWORD say where and as whom; for the compose stack, see the README's docker-compose section)")
		}
		return exitFailed
	}
	defer nc.Close()
	q, err := nc.Open(ctx, queue.Config{}, queue.Existing)
	if err != nil {
		fmt.Fprintf(stderr, "dispatchctl: NATS_URL=%s: %v\n", queue.RedactURLs(natsCfg.URL), err)
		return exitFailed
	}
	ctl, err := q.Control(ctx, log)
	if err != nil {
		fmt.Fprintln(stderr, "dispatchctl:", err)
		return exitFailed
	}
	svc, err := admin.New(admin.Config{Queue: q, Control: ctl, Log: log})
	if err != nil {
		fmt.Fprintln(stderr, "dispatchctl:", err)
		return exitFailed
	}
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
		return enc.Encode(v)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

func status(ctx context.Context, e *env, _ []string) error {
	st, err := e.svc.Status(ctx)
	if err != nil {
		return err
	}
	return e.print(st, func(w *tabwriter.Writer) {
		q := st.Queue
		fmt.Fprintf(w, "QUEUE\t%d requests for %d clients, oldest %s; %d dead letters\n", q.Requests, q.Clients, orText(ago(q.Oldest), "none"), q.DeadLetters)
		fmt.Fprintln(w)
		printLeases(w, st)
		fmt.Fprintln(w)
		n := st.NATS
		fmt.Fprintf(w, "NATS\tconnected to %s; servers answering: %s\n", n.Connected, orText(strings.Join(n.Servers, ", "), "none"))
		if n.Meta != nil {
			fmt.Fprintf(w, "meta group\tleader %s; %s\n", orText(n.Meta.Leader, "NONE"), replicasText(n.Meta.Replicas))
		} else {
			fmt.Fprintf(w, "meta group\t%s\n", n.MetaNote)
		}
		fmt.Fprintf(w, "\nSTREAM\tMESSAGES\tREPLICAS\tLEADER\tFOLLOWERS\n")
		for _, s := range n.Streams {
			switch {
			case s.Error != "":
				fmt.Fprintf(w, "%s\t-\t-\t-\t%s\n", s.Name, s.Error)
			case s.Group == nil:
				fmt.Fprintf(w, "%s\t%d\t%d\t%s\t-\n", s.Name, s.Messages, s.Replicas, orText(n.Connected, "this server"))
			default:
				fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\n", s.Name, s.Messages, s.Replicas, orText(s.Group.Leader, "NONE"), replicasText(s.Group.Replicas))
			}
		}
	})
}

func printLeases(w io.Writer, st admin.Status) {
	l := st.Leases
	if l == nil {
		fmt.Fprintf(w, "DISPATCHERS\t%s\n", st.LeasesNote)
		return
	}
	fmt.Fprintf(w, "DISPATCHERS\t%d instances, %d partitions, lease TTL %s\n", len(l.Instances), l.Partitions, l.TTL)
	fmt.Fprintf(w, "INSTANCE\tHEARTBEAT\tPARTITIONS\tHELD SINCE\tLAST RENEWED\n")
	for _, in := range l.Instances {
		var ps []int
		var oldest, newest, renewed time.Time
		for _, le := range in.Leases {
			ps = append(ps, le.Partition)
			if !le.Since.IsZero() && (oldest.IsZero() || le.Since.Before(oldest)) {
				oldest = le.Since
			}
			newest = later(newest, le.Since)
			renewed = later(renewed, le.Renewed)
		}
		since := ago(oldest)
		if newest.Sub(oldest) > time.Second {
			since = ago(oldest) + " to " + ago(newest)
		}
		fmt.Fprintf(w, "%s\t%s\t%d: %s\t%s\t%s\n", quote(in.ID), orText(ago(in.Heartbeat), "none (gone; its leases expire)"), len(ps), ranges(ps), since, ago(renewed))
	}
	if len(l.Unowned) == 0 {
		fmt.Fprintf(w, "unowned partitions\tnone\n")
	} else {
		fmt.Fprintf(w, "unowned partitions\t%d: %s (nothing is sent for their clients until a dispatcher takes them)\n", len(l.Unowned), ranges(l.Unowned))
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// ranges writes sorted partition numbers as runs: 0-31, 40, 42-43.
func ranges(ps []int) string {
	var parts []string
	for i := 0; i < len(ps); {
		j := i
		for j+1 < len(ps) && ps[j+1] == ps[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(ps[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", ps[i], ps[j]))
		}
		i = j + 1
	}
	return orText(strings.Join(parts, ", "), "-")
}

func replicasText(rs []queue.ReplicaStatus) string {
	if len(rs) == 0 {
		return "no followers"
	}
	var parts []string
	for _, r := range rs {
		state := "current"
		switch {
		case r.Offline:
			state = "OFFLINE"
		case !r.Current:
			state = "NOT CURRENT"
		}
		seen := "not seen"
		if r.Active > 0 {
			seen = "seen " + r.Active.Round(time.Millisecond).String() + " ago"
		}
		parts = append(parts, fmt.Sprintf("%s %s (lag %d, %s)", r.Name, state, r.Lag, seen))
	}
	return strings.Join(parts, "; ")
}

// ago says how long before now t was: "3s ago"; "" for the zero time.
func ago(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return time.Since(t).Round(time.Second).String() + " ago"
}

func clients(ctx context.Context, e *env, _ []string) error {
	page, err := e.svc.Clients(ctx, admin.ClientsQuery{Sort: e.o.sort, Limit: e.o.limit, Page: e.o.page})
	if err != nil {
		return err
	}
	return e.print(page, func(w *tabwriter.Writer) {
		fmt.Fprintf(w, "CLIENT\tBACKLOG\tOLDEST AGE\tLANE\tNEXT SEND\tATTEMPTS\tINTERVAL\tSTEERING\n")
		for _, c := range page.Clients {
			fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s\n", quote(c.ClientID), c.Backlog, dash(c.OldestAge), c.Lane,
				relative(c.NextSend), c.Attempts, dash(c.Interval), steerText(c.Steering))
		}
		fmt.Fprintf(w, "page %d of %d clients with a backlog, %d per page, by %s\n", page.Page, page.Total, page.Limit, page.Sort)
	})
}

func requestState(ctx context.Context, e *env, args []string) error {
	rs, err := e.svc.Request(ctx, args[0], e.o.client)
	if err != nil {
		return err
	}
	return e.print(rs, func(w *tabwriter.Writer) {
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
			fmt.Fprintf(w, "lane\t%s on %s, next send %s, %d failed attempts, interval %s\n", rs.Lane.State, rs.Dispatcher, relative(rs.Lane.NextSend), rs.Lane.Attempts, rs.Lane.Interval)
		}
		if d := rs.Delivery; d != nil {
			fmt.Fprintf(w, "delivered at\t%s on %s, attempt %d\n", d.Delivered.Format(time.RFC3339Nano), rs.Dispatcher, d.Attempt)
		}
		if d := rs.DeadLetter; d != nil {
			fmt.Fprintf(w, "reason\t%s\nattempts\t%d\nlast status\t%d\nlast error\t%s\ndead at\t%s\n", d.Reason, d.Attempts, d.LastStatus, dash(printable(d.LastError)), d.DeadAt.Format(time.RFC3339Nano))
		}
	})
}

func (e *env) filter() (queue.DeadFilter, error) {
	return admin.FilterOf(e.o.id, e.o.client, e.o.reason, e.o.since, e.o.until, time.Now())
}

func deadLetters(ctx context.Context, e *env, _ []string) error {
	f, err := e.filter()
	if err != nil {
		return err
	}
	if e.o.body {
		return deadLetterBodies(ctx, e, f)
	}
	list, total, err := e.svc.DeadLetters(ctx, f, e.o.limit)
	if err != nil {
		return err
	}
	return e.print(map[string]any{"total": total, "dead_letters": list}, func(w *tabwriter.Writer) {
		fmt.Fprintf(w, "SEQ\tID\tCLIENT\tREASON\tSTATUS\tATTEMPTS\tDEAD AT\tLAST ERROR\n")
		for _, d := range list {
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", d.Seq, d.ID, quote(d.ClientID), d.Reason, d.LastStatus, d.Attempts, d.DeadAt.Format(time.RFC3339), dash(printable(d.LastError)))
		}
		fmt.Fprintf(w, "%d shown of %d selected\n", len(list), total)
	})
}

// deadLetterBodies prints dead letters with their stored headers and bodies: a body
// that is not UTF-8 text is shown in base64.
func deadLetterBodies(ctx context.Context, e *env, f queue.DeadFilter) error {
	list, total, err := e.svc.DeadLetterBodies(ctx, f, e.o.limit)
	if err != nil {
		return err
	}
	if e.o.json {
		return e.print(map[string]any{"total": total, "dead_letters": list}, nil)
	}
	w := e.stdout // not a tabwriter: a body's own tabs stay as they are
	for _, d := range list {
		fmt.Fprintf(w, "== dead letter %d: request %s of %s, %s, %d attempts, last status %d, dead at %s\n",
			d.Seq, d.ID, quote(d.ClientID), d.Reason, d.Attempts, d.LastStatus, d.DeadAt.Format(time.RFC3339))
		names := slices.Sorted(maps.Keys(d.Headers))
		for _, k := range names {
			for _, v := range d.Headers[k] {
				fmt.Fprintf(w, "%s: %s\n", k, v)
			}
		}
		fmt.Fprintln(w)
		if d.Body != nil {
			fmt.Fprintf(w, "%s\n\n", printable(*d.Body))
		} else {
			fmt.Fprintf(w, "(%d bytes, not text; in base64:)\n%s\n\n", d.BodyBytes, base64.StdEncoding.EncodeToString(d.BodyBase64))
		}
	}
	fmt.Fprintf(w, "%d shown of %d selected\n", len(list), total)
	return nil
}

// printable escapes the control characters in s but newlines and tabs, so that a body
// cannot steer the operator's terminal.
func printable(s string) string {
	var b strings.Builder
	for _, r := range s {
		if (unicode.IsControl(r) && r != '\n' && r != '\t') || unicode.Is(unicode.Bidi_Control, r) || r == utf8.RuneError {
			fmt.Fprintf(&b, "\\x%02x", r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func replay(ctx context.Context, e *env, _ []string) error {
	f, err := e.filter()
	if err != nil {
		return err
	}
	if f == (queue.DeadFilter{}) && !e.o.all {
		return fmt.Errorf("%w: replaying every dead letter needs -all; or select them with -id, -client, -reason, -since or -until", admin.ErrInvalid)
	}
	var items []admin.ReplayItem
	rep, err := e.svc.Replay(ctx, f, e.o.all, e.o.dryRun, func(it admin.ReplayItem) {
		if e.o.json {
			items = append(items, it)
			return
		}
		fmt.Fprintf(e.stdout, "%s\t%s\t%s\t%s\n", it.Outcome, it.ID, quote(it.ClientID), it.Why)
	})
	if e.o.json {
		if perr := e.print(map[string]any{"report": rep, "items": items}, nil); perr != nil {
			return perr
		}
	} else {
		n, verb := rep.Requeued, "requeued"
		if rep.DryRun {
			n, verb = rep.Matched, "would be requeued"
		}
		fmt.Fprintf(e.stdout, "%d matched, %d %s, %d skipped\n", rep.Matched, n, verb, rep.Skipped)
	}
	if errors.Is(err, admin.ErrInvalid) {
		return err
	}
	if err != nil {
		return fmt.Errorf("stopped after %d of the matches (running it again is safe): %w", rep.Matched, err)
	}
	return nil
}

func steering(ctx context.Context, e *env, _ []string) error {
	st, err := e.svc.Steering(ctx)
	if err != nil {
		return err
	}
	return e.print(st, func(w *tabwriter.Writer) {
		global := st.GlobalInterval
		if global == "default" {
			global = "default: each dispatcher's DISPATCH_INTERVAL"
		}
		if st.Global != nil && st.Global.By != "" {
			global += fmt.Sprintf(" (set by %s at %s)", printable(st.Global.By), st.Global.UpdatedAt.Format(time.RFC3339))
		}
		fmt.Fprintf(w, "global interval\t%s\n", global)
		if len(st.Clients) > 0 {
			fmt.Fprintf(w, "\nCLIENT\tSTEERING\tBY\tAT\n")
			for id, s := range st.Clients {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", quote(id), steerText(&s), printable(s.By), s.UpdatedAt.Format(time.RFC3339))
			}
		}
	})
}

func globalInterval(ctx context.Context, e *env, args []string) error {
	d, err := admin.ParseInterval(args[0])
	if err != nil {
		return err
	}
	changed, err := e.svc.SetInterval(ctx, d, e.by)
	if err != nil {
		return err
	}
	if !changed && !e.o.json {
		fmt.Fprintf(e.stdout, "the global interval is %s already; nothing changed\n", args[0])
	}
	return steering(ctx, e, nil)
}

func clientInterval(ctx context.Context, e *env, args []string) error {
	d, err := admin.ParseInterval(args[1])
	if err != nil {
		return err
	}
	res, err := e.svc.SetClientInterval(ctx, args[0], d, e.by)
	return e.steered(res, err, func(w io.Writer, c string) {
		switch {
		case !res.Changed && d == 0:
			fmt.Fprintf(w, "%s has no interval of its own; nothing changed\n", c)
		case !res.Changed:
			fmt.Fprintf(w, "%s has interval %s already; nothing changed\n", c, d)
		case d == 0:
			fmt.Fprintf(w, "%s is back on the global interval\n", c)
		default:
			fmt.Fprintf(w, "%s now has interval %s, on every dispatcher within a second\n", c, d)
		}
	})
}

func pause(ctx context.Context, e *env, args []string) error {
	res, err := e.svc.Pause(ctx, args[0], e.by)
	return e.steered(res, err, func(w io.Writer, c string) {
		switch {
		case !res.Changed:
			fmt.Fprintf(w, "%s was paused already; nothing changed\n", c)
		case res.Queued == nil:
			fmt.Fprintf(w, "paused %s; what is queued for it waits (its backlog could not be counted just now)\n", c)
		case *res.Queued == 0:
			fmt.Fprintf(w, "paused %s: nothing is queued for it now; what is accepted for it waits until resume\n", c)
		default:
			fmt.Fprintf(w, "paused %s: its %d queued requests wait (an attempt in flight ends first); new ones are still accepted\n", c, *res.Queued)
		}
	})
}

func resume(ctx context.Context, e *env, args []string) error {
	res, err := e.svc.Resume(ctx, args[0], e.by)
	return e.steered(res, err, func(w io.Writer, c string) {
		switch {
		case !res.Changed:
			fmt.Fprintf(w, "%s was not paused; nothing changed\n", c)
		case res.Queued == nil:
			fmt.Fprintf(w, "resumed %s; what is queued for it goes out, spaced as usual\n", c)
		case *res.Queued == 0:
			fmt.Fprintf(w, "resumed %s: nothing is queued for it\n", c)
		default:
			fmt.Fprintf(w, "resumed %s: its %d queued requests go out, spaced as usual\n", c, *res.Queued)
		}
	})
}

// steered prints what a change to one client's steering did: say, in a sentence, or
// the result as JSON; and what the client's steering is now.
func (e *env) steered(res admin.ClientSteering, err error, say func(w io.Writer, client string)) error {
	if err != nil {
		return err
	}
	return e.print(res, func(w *tabwriter.Writer) {
		say(w, quote(res.ClientID))
		fmt.Fprintf(w, "steering of %s now: %s\n", quote(res.ClientID), res.Steering)
	})
}

func purge(ctx context.Context, e *env, args []string) error {
	client := args[0]
	confirm := ""
	if e.o.yes {
		confirm = client
	} else {
		fmt.Fprintf(e.stderr, "This moves every request now queued for %s to the dead-letter stream, unsent.\nType the clientId to confirm: ", quote(client))
		line, _ := bufio.NewReader(e.stdin).ReadString('\n')
		confirm = strings.TrimRight(line, "\r\n")
		if confirm != client {
			return fmt.Errorf("%w: not confirmed; nothing changed (use -yes to skip the question)", admin.ErrInvalid)
		}
	}
	res, err := e.svc.Purge(ctx, client, confirm, e.by, e.o.wait)
	if err != nil {
		return err
	}
	return e.print(res, func(w *tabwriter.Writer) {
		switch {
		case res.Requests == 0:
			fmt.Fprintf(w, "%s has nothing queued; nothing to purge\n", quote(client))
		case res.Remaining == 0:
			fmt.Fprintf(w, "%s: %d requests moved to the dead-letter stream (reason purged); replay brings them back\n", quote(client), res.Requests)
		default:
			fmt.Fprintf(w, "%s: purge of %d requests asked for, %d still queued: the dispatcher owning the client moves them (is one running?)\n", quote(client), res.Requests, res.Remaining)
		}
	})
}

func steerText(s *request.Steering) string {
	if s == nil || s.IsZero() {
		return "-"
	}
	return s.String()
}

func relative(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Until(t).Round(time.Millisecond)
	if d <= 0 {
		return "now"
	}
	return "in " + d.String()
}

// quote shows an id (a clientId, an instance) safely: quoted when it holds spaces or
// quotes, and any control character escaped, so that it cannot steer the terminal.
func quote(s string) string {
	if s == "" {
		return "-"
	}
	if strings.ContainsAny(s, " \t\"") || printable(s) != s {
		return strconv.QuoteToASCII(s)
	}
	return s
}

func dash(s string) string { return orText(s, "-") }

func orText(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
