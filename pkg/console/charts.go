package console

import (
	"fmt"
	"html/template"
	"net/url"
	"strings"
	"time"

	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// Charts are drawn as inline SVG by the templates from the numbers computed here: no
// script, and nothing for the Content-Security-Policy to allow.

// gapData is a client's last gaps as bars, each with its interval as a tick, and the
// current interval as a line across. A gap below its interval breaks the guarantee: its
// bar is marked, and the page says so above the chart.
type gapData struct {
	Width, Height int
	Bars          []gapBar
	LineY         float64 // the latest interval
	LineLabel     string
	LabelX        float64
	TopLabel      string
	Below         int
	Empty         bool
}

type gapBar struct {
	X, Y, W, H, TickY float64
	Below             bool
	Title             string
}

const (
	gapWidth, gapHeight = 640, 200
	gapTop              = 12.0 // room for the labels
)

func gapChart(history []introspect.Attempt) gapData {
	d := gapData{Width: gapWidth, Height: gapHeight}
	var gaps []introspect.Attempt
	for _, a := range history {
		if a.HasGap {
			gaps = append(gaps, a)
		}
	}
	if len(gaps) == 0 {
		d.Empty = true
		return d
	}
	// Every gap below its interval is counted; the chart has room for the last
	// HistoryPerClient (two instances' histories of a client that moved can hold more).
	for _, a := range gaps {
		if a.Gap < a.Interval {
			d.Below++
		}
	}
	gaps = gaps[max(0, len(gaps)-dispatch.HistoryPerClient):]
	top := time.Duration(0)
	for _, a := range gaps {
		top = max(top, a.Gap, a.Interval)
	}
	top = top + top/5
	plot := float64(gapHeight) - gapTop
	y := func(v time.Duration) float64 { return gapTop + plot*(1-float64(v)/float64(top)) }
	slot := float64(gapWidth) / float64(dispatch.HistoryPerClient)
	for i, a := range gaps {
		b := gapBar{X: float64(i)*slot + slot*0.15, W: slot * 0.7, Y: y(a.Gap), TickY: y(a.Interval), Below: a.Gap < a.Interval}
		b.H = float64(gapHeight) - b.Y
		b.Title = fmt.Sprintf("attempt of %s at %s: gap %s, interval %s", a.ID, a.Start.UTC().Format("15:04:05.000"), roundDur(a.Gap), a.Interval)
		if b.Below {
			b.Title += " — BELOW THE INTERVAL"
		}
		d.Bars = append(d.Bars, b)
	}
	last := gaps[len(gaps)-1].Interval
	d.LineY, d.LineLabel, d.TopLabel = y(last), "interval "+last.String(), roundDur(top).String()
	d.LabelX = float64(gapWidth) - 8*float64(len(d.LineLabel))
	return d
}

// sinceChart draws the time since a client's last delivery against its interval: the
// mark is one interval; the bar reaches it once the client may be sent to again.
type sinceChart struct {
	Known        bool
	Width, MarkX float64
	Len          float64
	Ready        bool
	Label        string
}

func sinceBar(c admin.Client, now time.Time) sinceChart {
	interval, err := time.ParseDuration(c.Interval)
	if err != nil || interval <= 0 || c.LastDelivered.IsZero() {
		return sinceChart{}
	}
	since := now.Sub(c.LastDelivered)
	s := sinceChart{Known: true, Width: 120, MarkX: 60, Ready: since >= interval}
	s.Len = min(60*float64(since)/float64(interval), 120)
	s.Label = fmt.Sprintf("%s since the last delivery; interval %s", roundDur(since), interval)
	return s
}

// barChart is a histogram: raven's answers by latency.
type barChart struct {
	Width, Height int
	Bars          []bar
	Empty         bool
}

type bar struct {
	X, Y, W, H float64
	Label      string // under the bar: its bound, ">10s" for the last
	Title      string // what it counts: "up to 5ms", "over 10s" for the last
	Count      int
}

func latencyBars(a introspect.Activity) barChart {
	const w, h = 616, 130
	c := barChart{Width: w, Height: h}
	most := 0
	for _, n := range a.Latency {
		most = max(most, n)
	}
	if most == 0 {
		c.Empty = true
		return c
	}
	slot := float64(w) / float64(len(a.Latency))
	for i, n := range a.Latency {
		last := introspect.LatencyBounds[len(introspect.LatencyBounds)-1].String()
		label, title := ">"+last, "over "+last
		if i < len(introspect.LatencyBounds) {
			label = introspect.LatencyBounds[i].String()
			title = "up to " + label
		}
		bh := float64(h-16) * float64(n) / float64(most)
		c.Bars = append(c.Bars, bar{X: float64(i)*slot + 2, W: slot - 4, Y: float64(h-16) - bh, H: bh, Label: label, Title: title, Count: n})
	}
	return c
}

// roundDur rounds d for reading: to the millisecond (gaps are judged against intervals
// to that), and below a millisecond to 100 µs.
func roundDur(d time.Duration) time.Duration {
	if d >= time.Millisecond || d <= -time.Millisecond {
		return d.Round(time.Millisecond)
	}
	return d.Round(100 * time.Microsecond)
}

var funcs = template.FuncMap{
	// ago is how long before now t was, rounded as a person reads it (admin.Age: "59s",
	// "1m1s", not "1m0.975s"); "never" for the zero time.
	"ago": func(now, t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return admin.Age(now.Sub(t)) + " ago"
	},
	// until is how long after now t is, rounded alike; "now" once it has passed.
	"until": func(now, t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		if !t.After(now) {
			return "now"
		}
		return "in " + admin.Age(t.Sub(now))
	},
	"ts": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05.000 UTC")
	},
	"dur": func(d time.Duration) string { return roundDur(d).String() },
	"rate": func(f float64) string {
		if f == 0 {
			return "0"
		}
		return fmt.Sprintf("%.2f", f)
	},
	// rateLimit and inFlightLimit write a budget's limits, where 0 is no limit (not
	// "nothing is sent").
	"rateLimit": func(f float64) string {
		if f <= 0 {
			return "no limit"
		}
		return fmt.Sprintf("%.2f/s", f)
	},
	"inFlightLimit": func(n int) string {
		if n <= 0 {
			return "no limit"
		}
		return fmt.Sprint(n)
	},
	// count writes n with its noun in the right number: "1 attempt", "2 attempts".
	"count": func(n any, one, many string) (string, error) {
		switch n := n.(type) {
		case int:
			return admin.Count(n, one, many), nil
		case uint64:
			return admin.Count(n, one, many), nil
		}
		return "", fmt.Errorf("count: %T is not a count", n)
	},
	"quantile": func(a introspect.Activity, q float64) string {
		switch v := a.Quantile(q); v {
		case 0:
			return "—"
		case -1:
			return "> " + introspect.LatencyBounds[len(introspect.LatencyBounds)-1].String()
		default:
			return "≤ " + v.String()
		}
	},
	"clientURL":  func(id string) string { return Prefix + "client?id=" + url.QueryEscape(id) },
	"purgeURL":   func(id string) string { return Prefix + "client/purge?id=" + url.QueryEscape(id) },
	"requestURL": func(id string) string { return Prefix + "request?id=" + url.QueryEscape(id) },
	"deadURL":    func(client string) string { return Prefix + "deadletters?client=" + url.QueryEscape(client) },
	"join":       strings.Join,
	"partitions": func(ls []int) string {
		s := make([]string, len(ls))
		for i, p := range ls {
			s[i] = fmt.Sprint(p)
		}
		return strings.Join(s, ", ")
	},
	"sub": func(a, b float64) float64 { return a - b },
	// eventDetails writes an event's attempt, status and reason, those it has, with a
	// separator between them only.
	"eventDetails": func(e request.Event) string {
		var parts []string
		if e.Attempt != 0 {
			parts = append(parts, fmt.Sprintf("attempt %d", e.Attempt))
		}
		if e.Status != 0 {
			parts = append(parts, fmt.Sprintf("status %d", e.Status))
		}
		if e.Reason != "" {
			parts = append(parts, "reason "+string(e.Reason))
		}
		return strings.Join(parts, ", ")
	},
}
