package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/queue"
)

func status(ctx context.Context, e *env, _ []string) error {
	st, err := e.svc.Status(ctx)
	if err != nil {
		return err
	}
	return e.print(st, func(w *tabwriter.Writer) {
		q := st.Queue
		fmt.Fprintf(w, "QUEUE\t%s for %s, oldest %s; %s\n", admin.Count(q.Requests, "request", "requests"), admin.Count(q.Clients, "client", "clients"),
			orText(ago(q.Oldest), "none"), admin.Count(q.DeadLetters, "dead letter", "dead letters"))
		fmt.Fprintln(w)
		printLeases(w, st)
		fmt.Fprintln(w)
		n := st.NATS
		fmt.Fprintf(w, "NATS\tconnected to %s; servers answering: %s\n", n.Connected, orText(strings.Join(n.Servers, ", "), "none"))
		switch {
		case n.Meta != nil:
			fmt.Fprintf(w, "meta group\tleader %s; %s\n", orText(n.Meta.Leader, "NONE"), replicasText(n.Meta.Replicas))
		case st.NoLeases:
			// As on a standalone: its NATS is one server, with no meta group to show, and
			// the note's advice on a cluster's configuration does not apply.
			fmt.Fprintf(w, "meta group\tnone shown (a standalone dispatcher's NATS is a single server inside it, with no meta group)\n")
		default:
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
		note := st.LeasesNote
		if st.NoLeases {
			note = noLeasesNote
		}
		fmt.Fprintf(w, "DISPATCHERS\t%s\n", note)
		return
	}
	fmt.Fprintf(w, "DISPATCHERS\t%d instances, %d partitions, lease TTL %s\n", len(l.Instances), l.Partitions, l.TTL)
	fmt.Fprintf(w, "INSTANCE\tHEARTBEAT\tPARTITIONS\tHELD SINCE\tLAST RENEWED\n")
	for _, in := range l.Instances {
		var ps []int
		var oldest, newest, renewed time.Time
		for _, le := range in.Leases {
			ps = append(ps, le.Partition)
			if oldest.IsZero() || le.Since.Before(oldest) {
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
		if late := in.NotRenewed(l.TTL, time.Now()); len(late) > 0 {
			fmt.Fprintf(w, "  not renewed\t%d: %s (last renewed over half a TTL ago: the lease may have lapsed for sending, and nothing is sent there until it is renewed or expires)\n", len(late), ranges(late))
		}
	}
	if len(l.Unowned) == 0 {
		fmt.Fprintf(w, "unowned partitions\tnone\n")
	} else {
		fmt.Fprintf(w, "unowned partitions\t%d: %s (nothing is sent for their clients until a dispatcher takes them)\n", len(l.Unowned), ranges(l.Unowned))
	}
}

// noLeasesNote is what status says when the lease bucket does not exist: what a
// standalone user needs, whose dispatcher holds no lease to show.
const noLeasesNote = "none with leases. A standalone dispatcher owns every partition without them, so whether it runs does not show here: " +
	"ask its operators' listener (curl -s http://127.0.0.1:9091/readyz, or at its OPS_ADDR) or open its console there (/console/). " +
	"On a cluster: no dispatcher has run yet."

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
			seen = "seen " + admin.Age(r.Active) + " ago"
		}
		parts = append(parts, fmt.Sprintf("%s %s (lag %d, %s)", r.Name, state, r.Lag, seen))
	}
	return strings.Join(parts, "; ")
}

// ago says how long before now t was, rounded as a person reads it: "3.2s ago", "59s
// ago", "1m1s ago"; "" for the zero time.
func ago(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return admin.Age(time.Since(t)) + " ago"
}
