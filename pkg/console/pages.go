package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// PageSize is how many clients or dead letters a page lists.
const PageSize = 100

func (c *Console) refresh() int { return max(int(c.cfg.Refresh/time.Second), 1) }

// by names who steers from the console, as the admin API's "admin-api <address>".
func by(r *http.Request) string { return "console " + r.RemoteAddr }

func (c *Console) overview(r *http.Request, v *view) (string, error) {
	o := c.cfg.Admin.Overview(r.Context())
	v.Title, v.Nav, v.Refresh, v.Data = "Overview", "overview", c.refresh(), overviewData{Overview: o, Latency: latencyBars(o.Activity)}
	return "overview", nil
}

type overviewData struct {
	admin.Overview
	Latency barChart
}

func (c *Console) clients(r *http.Request, v *view) (string, error) {
	q := r.URL.Query()
	page, err := pageOf(q.Get("page"))
	if err != nil {
		return "", err
	}
	sort := q.Get("sort")
	if sort == "" {
		sort = admin.SortBacklog
	}
	cp, err := c.cfg.Admin.Clients(r.Context(), admin.ClientsQuery{Sort: sort, Limit: PageSize, Page: page, Search: q.Get("q"), Cached: true})
	if err != nil {
		return "", err
	}
	rows := make([]clientRow, len(cp.Clients))
	for i, cl := range cp.Clients {
		rows[i] = clientRow{Client: cl, Since: sinceBar(cl, v.Now)}
	}
	pages := max((cp.Total+PageSize-1)/PageSize, 1)
	v.Title, v.Nav, v.Refresh = "Clients", "clients", c.refresh()
	if cp.Search != "" {
		v.Title = "Clients matching " + cp.Search
	}
	v.Data = clientsData{Page: cp, Rows: rows, Pages: pages,
		Prev: pageLink(q, min(page-1, pages), pages), Next: pageLink(q, page+1, pages),
		SortLinks: sortLinks(q, sort)}
	return "clients", nil
}

type clientsData struct {
	Page       admin.ClientsPage
	Rows       []clientRow
	Pages      int
	Prev, Next string
	SortLinks  []sortLink
}

type clientRow struct {
	admin.Client
	Since sinceChart
}

type sortLink struct {
	Label, Href string
	Current     bool
}

func sortLinks(q url.Values, current string) []sortLink {
	var out []sortLink
	for _, s := range []struct{ key, label string }{{admin.SortBacklog, "backlog"}, {admin.SortAge, "oldest age"}, {admin.SortNext, "next send"}} {
		u := url.Values{"sort": {s.key}}
		if q.Get("q") != "" {
			u.Set("q", q.Get("q"))
		}
		out = append(out, sortLink{Label: s.label, Href: Prefix + "clients?" + u.Encode(), Current: s.key == current})
	}
	return out
}

// pageLink is the address of page p of the same listing; empty when there is none.
func pageLink(q url.Values, p, pages int) string {
	if p < 1 || p > pages {
		return ""
	}
	u := url.Values{}
	for k, vs := range q {
		if k != "page" && k != "flash" {
			u[k] = vs
		}
	}
	u.Set("page", strconv.Itoa(p))
	return "?" + u.Encode()
}

func pageOf(s string) (int, error) {
	if s == "" {
		return 1, nil
	}
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 1_000_000 {
		return 0, errStatus{http.StatusBadRequest, fmt.Errorf("page %q: a number from 1 to 1000000", s)}
	}
	return p, nil
}

func clientIDParam(r *http.Request, field string) (string, error) {
	id := r.FormValue(field)
	if err := request.ValidateClientID(id); err != nil {
		return "", errStatus{http.StatusBadRequest, fmt.Errorf("clientId %q: %w", id, err)}
	}
	return id, nil
}

func (c *Console) client(r *http.Request, v *view) (string, error) {
	id, err := clientIDParam(r, "id")
	if err != nil {
		return "", err
	}
	cv, err := c.cfg.Admin.Client(r.Context(), id)
	if err != nil {
		return "", err
	}
	d := clientData{View: cv, Gaps: gapChart(cv.History), Since: sinceBar(cv.Client, v.Now)}
	if last, ok := cv.LastDelivery(); ok {
		d.LastDelivery = last.End
	}
	if cv.Steering != nil {
		d.Paused = cv.Steering.Paused
		if cv.Steering.Interval > 0 {
			d.OwnInterval = time.Duration(cv.Steering.Interval).String()
		}
	}
	v.Title, v.Nav, v.Refresh, v.Data = id+" · Client", "clients", c.refresh(), d
	return "client", nil
}

type clientData struct {
	View         admin.ClientView
	Gaps         gapData
	Since        sinceChart
	LastDelivery time.Time
	Paused       bool
	OwnInterval  string
}

func (c *Console) purgePage(r *http.Request, v *view) (string, error) {
	id, err := clientIDParam(r, "id")
	if err != nil {
		return "", err
	}
	cv, err := c.cfg.Admin.Client(r.Context(), id)
	if err != nil {
		return "", err
	}
	v.Title, v.Nav, v.Data = "Purge "+id, "clients", cv
	return "purge", nil
}

// backTo redirects to the client's page with a flash message.
func backTo(w http.ResponseWriter, r *http.Request, id string, flash url.Values) {
	flash.Set("id", id)
	http.Redirect(w, r, Prefix+"client?"+flash.Encode(), http.StatusSeeOther)
}

func (c *Console) steerClient(w http.ResponseWriter, r *http.Request, what string, do func(ctx context.Context, id string) error) {
	id, err := clientIDParam(r, "id")
	if err != nil {
		c.fail(w, r, statusOf(err), err.Error())
		return
	}
	if err := do(r.Context(), id); err != nil {
		c.fail(w, r, statusOf(err), err.Error())
		return
	}
	backTo(w, r, id, url.Values{"flash": {what}})
}

func (c *Console) pause(w http.ResponseWriter, r *http.Request) {
	c.steerClient(w, r, "paused", func(ctx context.Context, id string) error {
		_, err := c.cfg.Admin.Pause(ctx, id, by(r))
		return err
	})
}

func (c *Console) resume(w http.ResponseWriter, r *http.Request) {
	c.steerClient(w, r, "resumed", func(ctx context.Context, id string) error {
		_, err := c.cfg.Admin.Resume(ctx, id, by(r))
		return err
	})
}

// intervalField reads the interval an operator typed in form f: empty, "0" or "default"
// is zero (the default). A form without the field at all (not the console's own, which
// always sends it) is refused: it would have set the default without anyone asking.
func intervalField(f url.Values) (time.Duration, error) {
	vs, ok := f["interval"]
	if !ok || len(vs) != 1 {
		return 0, errStatus{http.StatusBadRequest, errors.New("the form must carry one interval field (empty for the default)")}
	}
	return durationField(vs[0])
}

// durationField reads a duration an operator typed: empty, "0" or "default" is zero.
func durationField(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "0" || s == "default" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, errStatus{http.StatusBadRequest, fmt.Errorf("interval %q: a duration such as 5s or 1m30s, or empty for the default", s)}
	}
	return d, nil
}

func (c *Console) setClientInterval(w http.ResponseWriter, r *http.Request) {
	c.steerClient(w, r, "interval", func(ctx context.Context, id string) error {
		d, err := intervalField(r.PostForm)
		if err != nil {
			return err
		}
		_, err = c.cfg.Admin.SetClientInterval(ctx, id, d, by(r))
		return err
	})
}

// PurgeWait is how long a purge from the console waits for the dispatcher to finish.
const PurgeWait = 5 * time.Second

func (c *Console) purge(w http.ResponseWriter, r *http.Request) {
	id, err := clientIDParam(r, "id")
	if err != nil {
		c.fail(w, r, statusOf(err), err.Error())
		return
	}
	// The purge takes what the page showed: up to the newest request it counted.
	through, err := strconv.ParseUint(r.PostForm.Get("through"), 10, 64)
	if err != nil || through == 0 {
		c.fail(w, r, http.StatusBadRequest, "The purge form carries no valid bound (through): open the purge page again.")
		return
	}
	res, err := c.cfg.Admin.PurgeThrough(r.Context(), id, r.PostForm.Get("confirm"), by(r), through, PurgeWait)
	if err != nil {
		c.fail(w, r, statusOf(err), err.Error())
		return
	}
	backTo(w, r, id, url.Values{"flash": {"purged"}, "n": {strconv.FormatUint(res.Requests, 10)}, "left": {strconv.FormatUint(res.Remaining, 10)}})
}

// flashText is the message an action left for the page it redirected to; the page's
// address carries only a code and numbers, never text to show.
func flashText(q url.Values) string {
	switch q.Get("flash") {
	case "paused":
		return "Paused: nothing more is sent to this client until it is resumed; its requests wait."
	case "resumed":
		return "Resumed: its requests go again, spaced by its interval."
	case "interval":
		return "Interval set: it applies from the next send."
	case "purged":
		n, _ := strconv.ParseUint(q.Get("n"), 10, 64)
		left, _ := strconv.ParseUint(q.Get("left"), 10, 64)
		if left > 0 {
			return fmt.Sprintf("Purge asked for: %s; %d still being moved to the dead letters.", admin.Count(n, "request", "requests"), left)
		}
		return fmt.Sprintf("Purged: %s moved to the dead letters (reason purged).", admin.Count(n, "request", "requests"))
	case "global":
		return "Global interval set."
	case "cancelled":
		return "Cancelled: the request left its client's queue unsent; raven never receives it."
	}
	return ""
}

func (c *Console) deadLetters(r *http.Request, v *view) (string, error) {
	q := r.URL.Query()
	f, err := deadFilter(q)
	if err != nil {
		return "", err
	}
	list, total, err := c.cfg.Admin.DeadLetters(r.Context(), f, PageSize)
	if err != nil {
		return "", err
	}
	v.Title, v.Nav = "Dead letters", "deadletters"
	v.Data = deadData{Filter: f, Form: q, List: list, Total: total, Reasons: reasons}
	return "deadletters", nil
}

// reasons are the dead-letters page's filter: every reason.
var reasons = request.Reasons

type deadData struct {
	Filter  queue.DeadFilter
	Form    url.Values
	List    []request.DeadLetter
	Total   int
	Reasons []request.Reason
}

// MaxSelected is the most dead letters one replay of selected ones takes.
const MaxSelected = 1000

// replay replays the selected dead letters, or all that match the filter: a dry run
// first, which shows the count and a form to confirm; then the replay.
func (c *Console) replay(w http.ResponseWriter, r *http.Request) {
	form := r.PostForm
	f, err := deadFilter(form)
	if err != nil {
		c.fail(w, r, statusOf(err), err.Error())
		return
	}
	mode, ids := form.Get("mode"), form["id"]
	dry := form.Get("confirm") != "yes"
	// A confirmed replay takes what its dry run counted: nothing dead-lettered since.
	if t := form.Get("through"); t != "" {
		if f.Through, err = strconv.ParseUint(t, 10, 64); err != nil {
			c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("through %q: a dead-letter sequence number.", t))
			return
		}
	}
	switch mode {
	case "selected":
		if len(ids) == 0 || len(ids) > MaxSelected {
			c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("Select from 1 to %d dead letters to replay (%d selected).", MaxSelected, len(ids)))
			return
		}
		f.IDs = ids // one pass over the dead letters, whatever the number selected
	case "all":
	default:
		c.fail(w, r, http.StatusBadRequest, `Choose "replay selected" or "replay all that match".`)
		return
	}
	rep, err := c.cfg.Admin.Replay(r.Context(), f, mode == "all", dry, nil)
	if err != nil {
		c.fail(w, r, statusOf(err), fmt.Sprintf("Replay stopped after %d requeued: %s. Running it again is safe.", rep.Requeued, err))
		return
	}
	sess, _ := c.session(r)
	c.render(w, r, http.StatusOK, "replay", view{Title: "Replay", Nav: "deadletters", CSRF: c.csrf(sess), Now: c.now(),
		Data: replayData{Report: rep, Mode: mode, IDs: ids, Filter: f, Form: form}})
}

type replayData struct {
	Report admin.ReplayReport
	Mode   string
	IDs    []string
	Filter queue.DeadFilter
	Form   url.Values
}

func (c *Console) request(r *http.Request, v *view) (string, error) {
	id := strings.TrimSpace(r.URL.Query().Get("id"))
	v.Title, v.Nav = "Request", "request"
	d := requestData{ID: id, Client: r.URL.Query().Get("client")}
	if id != "" {
		v.Title = id + " · Request"
		st, err := c.cfg.Admin.Request(r.Context(), id, r.URL.Query().Get("client"))
		if err != nil {
			return "", err
		}
		d.State = &st
		client := d.Client
		if client == "" {
			client = st.ClientID
		}
		if request.ValidateID(id) == nil && client != "" {
			d.Events, d.EventsErr = c.cfg.Admin.Events(r.Context(), client, id)
		}
	}
	v.Data = d
	return "request", nil
}

// cancel cancels a queued request (its form on the request page), and goes back to the
// request's page, which shows it cancelled.
func (c *Console) cancel(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimSpace(r.PostForm.Get("id"))
	client, err := clientIDParam(r, "client")
	if err != nil {
		c.fail(w, r, statusOf(err), err.Error())
		return
	}
	if _, err := c.cfg.Admin.Cancel(r.Context(), client, id); err != nil {
		c.fail(w, r, statusOf(err), err.Error())
		return
	}
	http.Redirect(w, r, Prefix+"request?"+url.Values{"id": {id}, "client": {client}, "flash": {"cancelled"}}.Encode(), http.StatusSeeOther)
}

type requestData struct {
	ID        string
	Client    string
	State     *admin.RequestState
	Events    []request.Event
	EventsErr error
}

func (c *Console) steering(r *http.Request, v *view) (string, error) {
	st, err := c.cfg.Admin.Steering(r.Context())
	if err != nil {
		return "", err
	}
	v.Title, v.Nav, v.Refresh, v.Data = "Steering", "steering", c.refresh(), st
	return "steering", nil
}

func (c *Console) setInterval(w http.ResponseWriter, r *http.Request) {
	d, err := intervalField(r.PostForm)
	if err == nil {
		_, err = c.cfg.Admin.SetInterval(r.Context(), d, by(r))
	}
	if err != nil {
		c.fail(w, r, statusOf(err), err.Error())
		return
	}
	http.Redirect(w, r, Prefix+"steering?flash=global", http.StatusSeeOther)
}

func urlQueryEscape(s string) string { return url.QueryEscape(s) }
