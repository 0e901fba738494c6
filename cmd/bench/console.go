package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/cmd/internal/cli"
	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/console"
	"github.com/penguinhq/dispatcher/pkg/dispatch"
	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// benchConsole measures the operators' console with many backlogged clients: the time
// to answer its pages (on loopback, one request at a time, so the server's time), beside
// the admin API's JSON answer of the same clients page (the same reads, no HTML). A real
// dispatcher holds every client's lane, held back by a raven budget of 1 send a second
// so that the backlog stays.
func benchConsole(ctx context.Context, s settings, log io.Writer) ([]row, error) {
	clients, reps := 100_000, 15
	if s.quick {
		clients, reps = 2_000, 3
	}
	n, err := startNode(ctx, false, queue.Config{})
	if err != nil {
		return nil, err
	}
	defer n.close()
	start := time.Now()
	if err := backlogClients(ctx, n, clients); err != nil {
		return nil, err
	}
	fmt.Fprintf(log, "bench: console: %d clients backlogged in %s\n", clients, time.Since(start).Round(time.Millisecond))
	ravenURL, stopRaven, err := serve(fastRaven{})
	if err != nil {
		return nil, err
	}
	defer stopRaven()
	d, stopDispatch, err := startDispatcher(ctx, n, ravenURL, 5*time.Second, func(c *dispatch.Config) { c.Budget.MaxRate = 1 })
	if err != nil {
		return nil, err
	}
	defer stopDispatch()
	const token = "bench-token"
	base, stop, err := serveConsole(ctx, n, d, token)
	if err != nil {
		return nil, err
	}
	defer stop()
	for d.Stats().Lanes < clients && time.Since(start) < 2*time.Minute {
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Fprintf(log, "bench: console: the dispatcher holds %d lanes\n", d.Stats().Lanes)

	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, Timeout: time.Minute}
	res, err := browser.PostForm(base+"/console/signin", url.Values{"token": {token}})
	if err != nil {
		return nil, err
	}
	res.Body.Close()
	timeGet := func(path string, header http.Header) (time.Duration, error) {
		return medianGet(ctx, browser, base+path, header, reps)
	}
	auth := http.Header{"Authorization": {"Bearer " + token}}
	api, err := timeGet("/admin/v1/clients?limit=100", auth)
	if err != nil {
		return nil, err
	}
	var rows []row
	pages := []struct{ name, path string }{
		{"overview", "/console/"},
		{"clients page, by backlog, page 1", "/console/clients"},
		{fmt.Sprintf("clients page, by backlog, page %d", clients/console.PageSize), fmt.Sprintf("/console/clients?page=%d", clients/console.PageSize)},
		{"clients page, by next send", "/console/clients?sort=next"},
		{"clients page, by oldest age", "/console/clients?sort=age"},
		{"clients page, search", "/console/clients?q=client-0123"},
		{"a client's page", "/console/client?id=client-000042"},
	}
	for _, p := range pages {
		took, err := timeGet(p.path, nil)
		if err != nil {
			return rows, err
		}
		fmt.Fprintf(log, "bench: console: %s: %s\n", p.name, ms(took))
		rows = append(rows, row{
			figure:    fmt.Sprintf("console: %s, %d backlogged clients (median of %d)", p.name, clients, reps),
			value:     ms(took),
			reference: ms(api) + " admin API, clients page 1 (JSON)",
			ratio:     fmt.Sprintf("%.2f", float64(took)/float64(api)),
			target:    "< 100 ms",
			verdict:   verdict(took < 100*time.Millisecond),
		})
	}
	return rows, nil
}

// serveConsole serves the admin API and the console over n's queue, with d answering the
// operators' questions, as the dispatcher's operators' listener does, behind token.
func serveConsole(ctx context.Context, n *node, d *dispatch.Dispatcher, token string) (base string, stop func(), err error) {
	stopQuestions, err := n.q.ServeQuestions("bench", introspect.AnswersOf(d), zerolog.Nop())
	if err != nil {
		return "", nil, err
	}
	fail := func(err error) (string, func(), error) {
		stopQuestions()
		return "", nil, err
	}
	ctl, err := n.q.Control(ctx, zerolog.Nop())
	if err != nil {
		return fail(err)
	}
	adm, err := admin.New(admin.Config{Queue: n.q, Control: ctl})
	if err != nil {
		return fail(err)
	}
	con, err := console.New(console.Config{Admin: adm, Token: token})
	if err != nil {
		return fail(err)
	}
	base, stopServe, err := serve(cli.OpsHandler(cli.NewRegistry(), nil, adm.Handler(token), con.Handler(), zerolog.Nop()))
	if err != nil {
		return fail(err)
	}
	return base, func() { stopServe(); stopQuestions() }, nil
}

// backlogClients queues one request for each of clients clients, a thousand at a time.
func backlogClients(ctx context.Context, n *node, clients int) error {
	batch := make([]request.Request, 0, 1000)
	for i := range clients {
		batch = append(batch, request.Request{ID: fmt.Sprintf("req-%06d", i), ClientID: fmt.Sprintf("client-%06d", i), ContentType: "application/json", Body: []byte(`{"n":1}`)})
		if len(batch) == cap(batch) || i == clients-1 {
			if _, errs := n.q.PublishAll(ctx, batch); errs[0] != nil {
				return errs[0]
			}
			batch = batch[:0]
		}
	}
	return nil
}

// medianGet GETs url reps+2 times with header, and gives the median time of all but the
// first two, which warm up (the first question waits for every answer).
func medianGet(ctx context.Context, client *http.Client, url string, header http.Header, reps int) (time.Duration, error) {
	var lat samples
	for i := range reps + 2 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if header != nil {
			req.Header = header
		}
		t := time.Now()
		res, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_, err = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		took := time.Since(t)
		if err != nil || res.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("GET %s: %d %v", url, res.StatusCode, err)
		}
		if i >= 2 {
			lat.add(took)
		}
	}
	return lat.quantiles(0.5)[0], nil
}
