package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/request"
)

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
			fmt.Fprintf(w, "paused %s: its %s wait (an attempt in flight ends first); new ones are still accepted\n", c, admin.Count(*res.Queued, "queued request", "queued requests"))
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
			fmt.Fprintf(w, "resumed %s: its %s go out, spaced as usual\n", c, admin.Count(*res.Queued, "queued request", "queued requests"))
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
			fmt.Fprintf(w, "%s: %s moved to the dead-letter stream (reason purged); replay brings them back\n", quote(client), admin.Count(res.Requests, "request", "requests"))
		default:
			fmt.Fprintf(w, "%s: purge of %s asked for, %d still queued: the dispatcher owning the client moves them (is one running?)\n", quote(client), admin.Count(res.Requests, "request", "requests"), res.Remaining)
		}
	})
}

func steerText(s *request.Steering) string {
	if s == nil || s.IsZero() {
		return "-"
	}
	return s.String()
}
