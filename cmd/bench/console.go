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
	batch := make([]request.Request, 0, 1000)
	for i := range clients {
		batch = append(batch, request.Request{ID: fmt.Sprintf("req-%06d", i), ClientID: fmt.Sprintf("client-%06d", i), ContentType: "application/json", Body: []byte(`{"n":1}`)})
		if len(batch) == cap(batch) || i == clients-1 {
			if _, errs := n.q.PublishAll(ctx, batch); errs[0] != nil {
				return nil, errs[0]
			}
			batch = batch[:0]
		}
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
	stopLanes, err := n.q.ServeLaneQueries(func(ctx context.Context, lq request.LaneQuery) (any, error) {
		return d.Answer(ctx, lq)
	})
	if err != nil {
		return nil, err
	}
	defer stopLanes()
	ctl, err := n.q.Control(ctx, zerolog.Nop())
	if err != nil {
		return nil, err
	}
	adm, err := admin.New(admin.Config{Queue: n.q, Control: ctl})
	if err != nil {
		return nil, err
	}
	const token = "bench-token"
	con, err := console.New(console.Config{Admin: adm, Token: token})
	if err != nil {
		return nil, err
	}
	base, stop, err := serve(cli.OpsHandler(cli.NewRegistry(), nil, adm.Handler(token), con.Handler(), zerolog.Nop()))
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
		var lat samples
		for i := range reps + 2 {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
			if header != nil {
				req.Header = header
			}
			t := time.Now()
			res, err := browser.Do(req)
			if err != nil {
				return 0, err
			}
			_, err = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			took := time.Since(t)
			if err != nil || res.StatusCode != http.StatusOK {
				return 0, fmt.Errorf("GET %s: %d %v", path, res.StatusCode, err)
			}
			if i >= 2 { // the first two warm up: the first lane query waits for every answer
				lat.add(took)
			}
		}
		return lat.quantiles(0.5)[0], nil
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
