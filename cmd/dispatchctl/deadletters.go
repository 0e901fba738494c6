package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

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
	return e.print(admin.DeadLettersPage[request.DeadLetter]{Total: total, DeadLetters: list}, func(w *tabwriter.Writer) {
		fmt.Fprintf(w, "SEQ\tID\tCLIENT\tREASON\tSTATUS\tATTEMPTS\tDEAD AT\tLAST ERROR\n")
		for _, d := range list {
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", d.Seq, d.ID, quote(d.ClientID), d.Reason, d.LastStatus, d.Attempts, d.DeadAt.Format(time.RFC3339), lastError(d.Verdict))
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
		return e.print(admin.DeadLettersPage[admin.DeadLetterBody]{Total: total, DeadLetters: list}, nil)
	}
	w := e.stdout // not a tabwriter: a body's own tabs stay as they are
	for _, d := range list {
		fmt.Fprintf(w, "== dead letter %d: request %s of %s, %s, %s, last status %d, dead at %s\n",
			d.Seq, d.ID, quote(d.ClientID), d.Reason, admin.Count(d.Attempts, "attempt", "attempts"), d.LastStatus, d.DeadAt.Format(time.RFC3339))
		printAnswer(w, d)
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

// lastError says how the last attempt failed: its error, or raven's status when raven
// answered (the dead letter keeps no error then); "-" when there was no attempt.
func lastError(v request.Verdict) string {
	switch {
	case v.LastError != "":
		return printable(v.LastError)
	case v.LastStatus != 0:
		return fmt.Sprintf("raven answered %d %s", v.LastStatus, http.StatusText(v.LastStatus))
	}
	return "-"
}

// printAnswer writes how d's last attempt failed: raven's answer with its kept headers
// and body, as the request's events hold it, or the attempt's error.
func printAnswer(w io.Writer, d admin.DeadLetterBody) {
	a := d.RavenAnswer
	switch {
	case a == nil && d.LastStatus != 0:
		fmt.Fprintf(w, "%s (its answer is not in the request's events: kept for STATUS_RETENTION, and not written with EVENTS=false)\n", lastError(d.Verdict))
	case a == nil:
		fmt.Fprintf(w, "last error: %s\n", lastError(d.Verdict))
	default:
		fmt.Fprintf(w, "raven answered %d %s", a.Status, http.StatusText(a.Status))
		for _, k := range slices.Sorted(maps.Keys(a.Headers)) {
			fmt.Fprintf(w, ", %s: %s", k, printable(a.Headers[k]))
		}
		if a.Truncated {
			fmt.Fprintf(w, " (body cut at %d bytes)", a.BodyBytes)
		}
		switch {
		case a.BodyEncoding == request.BodyBase64:
			fmt.Fprintf(w, ":\n(%d bytes, not text; in base64:)\n%s\n", a.BodyBytes, a.Body)
		case a.Body != "":
			fmt.Fprintf(w, ":\n%s\n", printable(a.Body))
		default:
			fmt.Fprintf(w, ", with no body\n")
		}
	}
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

// replay puts dead letters back, or with -dry-run says which it would: a table of
// them, as deadletters prints, then the count.
func replay(ctx context.Context, e *env, _ []string) error {
	f, err := e.filter()
	if err != nil {
		return err
	}
	if f.IsZero() && !e.o.all {
		return fmt.Errorf("%w: replaying every dead letter needs -all; or select them with -id, -client, -reason, -since or -until", admin.ErrInvalid)
	}
	var items []admin.ReplayItem
	rep, err := e.svc.Replay(ctx, f, e.o.all, e.o.dryRun, func(it admin.ReplayItem) { items = append(items, it) })
	if perr := e.print(map[string]any{"report": rep, "items": items}, func(w *tabwriter.Writer) { printReplay(w, rep, items) }); perr != nil {
		return perr
	}
	if errors.Is(err, admin.ErrInvalid) {
		return err
	}
	if err != nil {
		return fmt.Errorf("stopped after %d of the matches (running it again is safe): %w", rep.Matched, err)
	}
	return nil
}

// printReplay writes what a replay did to each dead letter as a table, and sums it up.
func printReplay(w io.Writer, rep admin.ReplayReport, items []admin.ReplayItem) {
	if len(items) > 0 {
		fmt.Fprintf(w, "OUTCOME\tID\tCLIENT\tREASON\tDEAD AT\tWHY\n")
		for _, it := range items {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", it.Outcome, it.ID, quote(it.ClientID), it.Reason, it.DeadAt.Format(time.RFC3339), dash(printable(it.Why)))
		}
	}
	n, verb := rep.Requeued, "requeued"
	if rep.DryRun {
		n, verb = rep.Matched, "would be requeued"
	}
	fmt.Fprintf(w, "%d matched, %d %s, %d skipped\n", rep.Matched, n, verb, rep.Skipped)
}
