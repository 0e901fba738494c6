package integration

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/console"
	"github.com/penguinhq/dispatcher/pkg/ledger"
)

// findChromium is the path of an installed Chromium or Chrome; empty when none is.
func findChromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// browserTab drives one tab of a headless Chromium against the console at base, saving
// a screenshot of each page it is asked to into dir.
type browserTab struct {
	t       *testing.T
	ctx     context.Context
	base    string
	dir     string
	dialogs atomic.Int32 // JavaScript dialogs that opened: a script ran that should not have
}

func newBrowserTab(t *testing.T, base string) *browserTab {
	t.Helper()
	chromium := findChromium()
	if chromium == "" {
		t.Skip("no Chromium installed (apt-get install chromium): the console's browser test needs one; CI installs it")
	}
	dir := os.Getenv("CONSOLE_SCREENSHOTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "console-screenshots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots of each page in %s", dir)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.WindowSize(1400, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	ctx, cancelTime := context.WithTimeout(ctx, 8*time.Minute) // bounds a hang of the browser; each wait below has its own
	t.Cleanup(func() { cancelTime(); cancelTab(); cancelAlloc() })
	b := &browserTab{t: t, ctx: ctx, base: base, dir: dir}
	if err := chromedp.Listen(ctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			b.dialogs.Add(1)
		}
	}); err != nil {
		t.Fatalf("starting Chromium (%s): %v", chromium, err)
	}
	return b
}

// do runs steps, failing the test with what it was doing if they fail or take more than
// two minutes (a step silent for longer was seen stopped as stuck beside another CI run,
// without a word of which one); a step of 10 s or more is logged.
func (b *browserTab) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	began := time.Now()
	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Minute)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatalf("%s: %v after %s", what, err, time.Since(began).Round(time.Millisecond))
	}
	if took := time.Since(began); took >= 10*time.Second {
		b.t.Logf("%s took %s", what, took.Round(time.Millisecond))
	}
}

func (b *browserTab) open(path string) {
	b.t.Helper()
	b.do("open "+path, chromedp.Navigate(b.base+path))
}

func (b *browserTab) text(sel string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		b.t.Fatalf("the text of %s: %v", sel, err)
	}
	return s
}

// waitText waits until the element sel shows want (a page loaded after a click).
func (b *browserTab) waitText(sel, want string) {
	b.t.Helper()
	deadline := time.Now().Add(time.Minute)
	last := ""
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		cancel()
		if err == nil && strings.Contains(s, want) {
			return
		}
		last = s
		time.Sleep(100 * time.Millisecond)
	}
	b.t.Fatalf("%s shows %q, want %q", sel, last, want)
}

// eval evaluates a JavaScript expression in the page and returns its value as text.
func (b *browserTab) eval(expr string) string {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[any](expr))
	if err != nil {
		b.t.Fatalf("evaluating %s: %v", expr, err)
	}
	if v == nil {
		return ""
	}
	return fmt.Sprint(v)
}

// reopenUntil loads path again until the element sel shows want (state read afresh by
// the server, with the page's own refresh paused).
func (b *browserTab) reopenUntil(path, sel, want string) {
	b.t.Helper()
	deadline := time.Now().Add(time.Minute)
	last := ""
	for time.Now().Before(deadline) {
		b.open(path)
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		cancel()
		if err == nil && strings.Contains(s, want) {
			return
		}
		last = s
		time.Sleep(200 * time.Millisecond)
	}
	b.t.Fatalf("%s on %s shows %q, want %q", sel, path, last, want)
}

func (b *browserTab) screenshot(name string) {
	b.t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(b.dir, name+".png"), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// arrivalsOf is the ledger's arrivals of one client.
func arrivalsOf(l *ledger.Ledger, client string) []ledger.Arrival {
	var out []ledger.Arrival
	for _, a := range l.Arrivals() {
		if a.ClientID == client {
			out = append(out, a)
		}
	}
	return out
}

// The console in a real browser against a real dispatcher, NATS and a recording raven:
// sign in, find a backlogged client, pause it and resume it from its page (raven hears
// nothing of it meanwhile), give it its own interval (raven's gaps follow), replay a dead
// letter after a dry run (raven receives it), show a clientId that is a script as text,
// and refuse a POST without the CSRF token.
func TestConsoleInARealBrowser(t *testing.T) {
	t.Parallel()
	if findChromium() == "" {
		t.Skip("no Chromium installed (apt-get install chromium): the console's browser test needs one; CI installs it")
	}
	const interval = 300 * time.Millisecond
	var doomedOnce atomic.Bool // raven refuses the doomed client's first request for good
	s := newStack(t, options{interval: interval, respond: func(a ledger.Arrival) ledger.Response {
		if a.ClientID == "doomed" && doomedOnce.CompareAndSwap(false, true) {
			return ledger.Response{Status: http.StatusUnprocessableEntity}
		}
		return ledger.Response{}
	}})
	ctl, err := s.q.Control(context.Background(), testLog())
	if err != nil {
		t.Fatal(err)
	}
	svc, err := admin.New(admin.Config{Queue: s.q, Control: ctl, Log: testLog(), Interval: interval, Instance: "console-test"})
	if err != nil {
		t.Fatal(err)
	}
	const token = "browser-test-token"
	con, err := console.New(console.Config{Admin: svc, Token: token, Log: testLog(), Refresh: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con.Handler())
	t.Cleanup(srv.Close)
	b := newBrowserTab(t, srv.URL)

	// Sign in: a wrong token first.
	b.open("/console/")
	b.waitText("h1", "Sign in")
	b.screenshot("signin")
	b.do("a wrong token", chromedp.SendKeys(chromedp.CSS("#token"), "wrong"), chromedp.Submit(chromedp.CSS("#signin")))
	b.waitText(".problem", "Sign-in refused.")
	b.do("the token", chromedp.SendKeys(chromedp.CSS("#token"), token), chromedp.Submit(chromedp.CSS("#signin")))
	b.waitText("h1", "Overview")

	// The session cookie: HttpOnly and SameSite=Strict, and no script on the page reads it.
	cookies, err := chromedp.Call(b.ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{srv.URL + "/console/"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(cookies.Cookies) != 1 || !cookies.Cookies[0].HTTPOnly || cookies.Cookies[0].SameSite != network.CookieSameSiteStrict {
		t.Fatalf("the console's cookies after signing in: %+v; want one session cookie, HttpOnly and SameSite=Strict", cookies.Cookies)
	}
	if got := b.eval(`document.cookie`); got != "" {
		t.Fatalf("a script on the page reads the cookies %q", got)
	}

	// The overview refreshes itself (every second here) until the toggle pauses that; the
	// rest of the test runs with it paused (the choice is kept), so no page changes
	// under a click.
	b.eval(`document.getElementById("content").dataset.old = "yes"`)
	b.do("the overview to refresh itself", chromedp.Poll[chromedp.Void](`!document.getElementById("content").dataset.old`,
		chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(time.Minute)))
	b.do("pause the refresh", chromedp.Click(chromedp.CSS("#refresh-toggle")))
	b.waitText("#refresh-toggle", "Resume refresh")
	b.eval(`document.getElementById("content").dataset.old = "yes"`)
	time.Sleep(2500 * time.Millisecond) // two and a half refresh periods
	if got := b.eval(`document.getElementById("content").dataset.old || ""`); got != "yes" {
		t.Fatal("the overview refreshed itself with the refresh paused")
	}

	// A backlogged client in the table.
	for n := range 40 {
		s.post("alice", n)
	}
	doomedID := s.post("doomed", 0)
	b.open("/console/clients")
	b.waitText(`tr[data-client="alice"] td.backlog`, "")
	backlog, _ := strconv.Atoi(b.text(`tr[data-client="alice"] td.backlog`))
	if backlog < 10 {
		t.Fatalf("alice's backlog in the table: %d, want most of her 40", backlog)
	}
	b.screenshot("clients")

	// Pause her from her page: raven hears nothing more of her until she is resumed.
	b.do("open alice's page", chromedp.Click(chromedp.CSS(`tr[data-client="alice"] a.client-link`)))
	b.waitText("h1", "alice")
	b.do("pause", chromedp.Click(chromedp.CSS("#pause button")))
	b.waitText("#flash", "Paused")
	// From when the dispatcher applied the pause (it learns of it through its watch),
	// raven may get one more of alice's requests, one that was being handed out as it
	// came, and nothing after that.
	steered := func(now string) int {
		n := 0
		for _, l := range logLines(s.dispatchLog.String(), "client steering changed") {
			if l["client_id"] == "alice" && l["now"] == now {
				n++
			}
		}
		return n
	}
	waitFor(t, time.Minute, "the dispatcher to apply alice's pause", func() bool { return steered("paused") == 1 })
	applied := time.Now()
	time.Sleep(8 * interval) // a paused client's sends would have come by now (a slow machine only hides them)
	during := len(arrivalsOf(s.ledger, "alice"))
	var after []time.Duration
	for _, a := range arrivalsOf(s.ledger, "alice") {
		if a.Start.After(applied) {
			after = append(after, a.Start.Sub(applied))
		}
	}
	if len(after) > 1 {
		t.Fatalf("raven received %d of alice's requests after her pause was applied (at %v after it), want at most the one being handed out", len(after), after)
	}
	// The page as it was after the pause may show an attempt still in flight: read it
	// again until the lane says paused.
	b.reopenUntil("/console/client?id=alice", "#lane-state", "paused")
	b.screenshot("client-paused")
	b.do("resume", chromedp.Click(chromedp.CSS("#resume button")))
	b.waitText("#flash", "Resumed")
	waitFor(t, time.Minute, "alice's requests to go again", func() bool { return len(arrivalsOf(s.ledger, "alice")) > during })

	// Her own interval: raven's next gaps follow it.
	const own = 900 * time.Millisecond
	b.do("set her interval", chromedp.SendKeys(chromedp.CSS("#interval-input"), own.String()), chromedp.Click(chromedp.CSS("#interval button")))
	b.waitText("#flash", "Interval set")
	// Judged from when the dispatcher applied it: every attempt after one that started
	// then comes her interval after it.
	waitFor(t, time.Minute, "the dispatcher to apply alice's interval", func() bool {
		for _, l := range logLines(s.dispatchLog.String(), "client steering changed") {
			if l["client_id"] == "alice" && strings.Contains(fmt.Sprint(l["now"]), own.String()) {
				return true
			}
		}
		return false
	})
	set := time.Now()
	// Three more of hers, so that there are some to send at the new interval however
	// long the steps before took (on a loaded CI run her 40 had all gone by then).
	for n := range 3 {
		s.post("alice", 100+n)
	}
	waitFor(t, time.Minute, "three of alice's requests after her interval was set", func() bool {
		n := 0
		for _, a := range arrivalsOf(s.ledger, "alice") {
			if a.Start.After(set) {
				n++
			}
		}
		return n >= 3
	})
	as := arrivalsOf(s.ledger, "alice")
	for i := 1; i < len(as); i++ {
		if as[i-1].Start.After(set) && as[i].Start.Sub(as[i-1].End) < own {
			t.Fatalf("a gap of %s at raven after alice's interval became %s", as[i].Start.Sub(as[i-1].End), own)
		}
	}
	// The chart comes from the dispatcher's answer, which a loaded machine may give after
	// the page's lane wait: read the page again until it is there.
	waitForState(t, time.Minute, "alice's gap chart with her last gaps", func() (bool, string) {
		b.open("/console/client?id=alice")
		b.waitText("#client-interval", "900ms")
		n, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](`document.querySelectorAll("#gaps rect.bar").length`))
		return err == nil && n >= 3, fmt.Sprintf("%d bars (%v)", n, err)
	})
	if n, _ := chromedp.Run(b.ctx, chromedp.Evaluate[int](`document.querySelectorAll("#gaps rect.below").length`)); n != 0 {
		t.Fatalf("alice's gap chart marks %d gaps below the interval", n)
	}
	b.screenshot("client")

	// A dead letter, replayed from its page after a dry run: raven receives it.
	waitFor(t, time.Minute, "the doomed request to be dead-lettered", func() bool { return s.dead()[doomedID] })
	b.open("/console/deadletters")
	row := fmt.Sprintf(`tr[data-id=%q]`, doomedID)
	b.waitText(row, "permanent")
	b.screenshot("deadletters")
	b.do("select it", chromedp.Click(chromedp.CSS(row+` input[name="id"]`)), chromedp.Click(chromedp.CSS("#dry-run-selected")))
	b.waitText("#replay-count", "1")
	if got := len(arrivalsOf(s.ledger, "doomed")); got != 1 {
		t.Fatalf("raven received %d of doomed's requests after the dry run, want only the first attempt", got)
	}
	b.screenshot("replay-dry-run")
	s.markReplayed(doomedID)
	b.do("confirm", chromedp.Click(chromedp.CSS("#replay-confirm-button")))
	b.waitText("#replay-result", "requeued 1")
	b.screenshot("replay-done")
	waitFor(t, time.Minute, "raven to receive the replayed request", func() bool {
		for _, a := range arrivalsOf(s.ledger, "doomed") {
			if a.ID == doomedID && a.Status == http.StatusOK {
				return true
			}
		}
		return false
	})
	b.reopenUntil("/console/request?id="+doomedID, "#request-state", "delivered") // its events are written as it goes
	if tl := b.text("#timeline"); !strings.Contains(tl, "dead_lettered") || !strings.Contains(tl, "replayed") || !strings.Contains(tl, "delivered") {
		t.Fatalf("the request's timeline: %q; want it dead-lettered, replayed and delivered", tl)
	}
	b.screenshot("request")

	// A clientId that is a script is shown, never run.
	const evil = "<script>alert(1)</script>"
	b.do("pause the evil client", chromedp.Navigate(b.base+"/console/client?id="+url.QueryEscape(evil)))
	b.do("pause it", chromedp.Click(chromedp.CSS("#pause button")))
	b.waitText("#flash", "Paused")
	// The page says so once the pause is written; the dispatcher applies it from its
	// watch: the client posts once it has, or a loaded machine may send one before it.
	waitFor(t, time.Minute, "the dispatcher to apply the evil client's pause", func() bool {
		for _, l := range logLines(s.dispatchLog.String(), "client steering changed") {
			if l["client_id"] == evil {
				return true
			}
		}
		return false
	})
	evilIDs := []string{s.post(evil, 0), s.post(evil, 1)}
	b.open("/console/clients?q=" + url.QueryEscape("<script>"))
	b.waitText(`#clients a.client-link`, evil)
	b.screenshot("clients-evil")
	b.do("open its page", chromedp.Click(chromedp.CSS(`#clients a.client-link`)))
	b.waitText("h1", evil)
	b.screenshot("client-evil")
	b.open("/console/steering")
	b.waitText("#steered", evil)
	b.screenshot("steering")
	b.open("/console/")
	b.waitText("h1", "Overview")
	b.screenshot("overview")
	if n := b.dialogs.Load(); n != 0 {
		t.Fatalf("%d JavaScript dialogs opened: a clientId ran as a script", n)
	}

	// A POST without the CSRF token is refused, from the page itself, with its cookie.
	status, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](
		`fetch("/console/client/resume", {method: "POST", body: new URLSearchParams({id: "alice"})}).then(r => r.status)`, chromedp.EvalAwaitPromise))
	if err != nil || status != http.StatusForbidden {
		t.Fatalf("a POST without the CSRF token: %d (%v), want 403", status, err)
	}

	// Cancel the paused client's second request from its request page: it leaves the
	// queue unsent, and its page says cancelled.
	asked := time.Now()
	cancelled := "/console/request?id=" + evilIDs[1] + "&client=" + url.QueryEscape(evil)
	b.open(cancelled)
	b.waitText("#request-state", "queued")
	b.do("cancel it", chromedp.Click(chromedp.CSS("#cancel button")))
	b.waitText("#flash", "Cancelled")
	b.reopenUntil(cancelled, "#request-state", "cancelled")
	s.cancelledAsked(evilIDs[1], asked)
	b.screenshot("request-cancelled")
	evilIDs = evilIDs[:1]

	// Purge the paused evil client from its page: the confirmation says how many, and
	// the one left goes to the dead letters unsent.
	b.open("/console/client?id=" + url.QueryEscape(evil))
	b.do("open the purge page", chromedp.Click(chromedp.CSS("#purge-link")))
	b.waitText("#purge-count", "1")
	b.screenshot("purge")
	if got := len(arrivalsOf(s.ledger, evil)); got != 0 {
		t.Fatalf("raven received %d of the paused client's requests", got)
	}
	b.do("purge", chromedp.Click(chromedp.CSS("#purge button")))
	b.waitText("#flash", "Purged: 1 request")
	// The purge is recorded at once; the dispatcher dead-letters the requests when the
	// client's lane next comes round (on a loaded machine, not by the time the page says so).
	waitForState(t, time.Minute, "both purged requests among the dead letters", func() (bool, string) {
		dead := s.dead()
		var missing []string
		for _, id := range evilIDs {
			if !dead[id] {
				missing = append(missing, id)
			}
		}
		return len(missing) == 0, fmt.Sprint("missing ", missing)
	})

	// Signing out ends the browser's session: the next page asks to sign in.
	b.do("sign out", chromedp.Click(chromedp.CSS(`form[action="/console/signout"] button`)))
	b.waitText("h1", "Sign in")
	b.open("/console/clients")
	b.waitText("h1", "Sign in")
	s.finish(60*time.Second, 0)
}
