package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/ingest"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

const (
	ingestWorkers = 64
	bodySize      = 512
	benchToken    = "bench-token"
)

// body is a 512-byte JSON request for client.
func body(client string) []byte {
	head := fmt.Sprintf(`{"clientId":%q,"pad":"`, client)
	return []byte(head + strings.Repeat("x", bodySize-len(head)-2) + `"}`)
}

// clientFor spreads a worker's requests over a thousand clients of its own, so that no
// client's backlog cap is reached.
func clientFor(worker, i int) string { return fmt.Sprintf("w%02d-c%04d", worker, i%1000) }

// The servers the ingest scenario compares, each fed by the same load generator.
const (
	kindRaw     = "raw JetStream publishes"
	kindBare    = "bare net/http answering 202"
	kindMinimal = "minimal publishing handler"
	kindIngest  = "ingest" // as the binary runs it: events on
	kindH2C     = "ingest over h2c"
	// kindIngestNoEvents is the ingest with EVENTS=false: what the accepted event costs
	// (announced live since ADR 18).
	kindIngestNoEvents = "ingest, events off"
	// kindIngestRepublished is the ingest announcing nothing itself, the server
	// republishing each stored request's headers instead (the stream's RePublish, headers
	// only, to the client's accepted subject): ADR 18's alternative, measured against
	// ingest's own core publish.
	kindIngestRepublished = "ingest, accepted republished by the server"
	// kindIngestTraced is the ingest with tracing on, exporting to tracedProvider's
	// receiver (the tracing scenario).
	kindIngestTraced = "ingest traced"
)

var ingestKinds = []string{kindRaw, kindBare, kindMinimal, kindIngest, kindIngestNoEvents, kindIngestRepublished, kindH2C}

// kindNames are the kinds' names for -kinds.
var kindNames = map[string]string{"raw": kindRaw, "bare": kindBare, "minimal": kindMinimal, "ingest": kindIngest, "ingest-no-events": kindIngestNoEvents, "ingest-republished": kindIngestRepublished, "h2c": kindH2C}

// benchIngest compares the project's ingest with the least any HTTP ingest on net/http
// must do (the minimal publishing handler: read the body, publish it with a message id to
// the client's subject, wait for the ack, answer 202), with a bare net/http server and
// with raw JetStream publishes for context. Every figure comes from the same out-of-process
// load generator, 64 callers, 512 B bodies, a fresh server each time, in interleaved
// rounds; the median round is reported, and the median of the rounds' ratios. Both
// durability modes.
func benchIngest(ctx context.Context, s settings, log io.Writer) ([]row, error) {
	var rows []row
	for _, syncAlways := range []bool{true, false} {
		mode := modeName(syncAlways)
		got, cpu, err := ingestRounds(ctx, s, syncAlways, log)
		if err != nil {
			return rows, err
		}
		if s.ingestKinds != nil {
			continue // figures only: the rows need every kind
		}
		med := func(kind string) float64 { return median(got[kind]) }
		// The ratio is the median of each round's ratio: the two were measured one right
		// after the other, so a round the machine was slower for counts against both.
		ratioOf := func(a, b string) float64 {
			var rs []float64
			for i := range got[a] {
				rs = append(rs, got[a][i]/got[b][i])
			}
			return median(rs)
		}
		target := 0.9
		if syncAlways {
			target = 0.95
		}
		ratio := ratioOf(kindIngest, kindMinimal)
		rows = append(rows,
			row{
				figure:    fmt.Sprintf("ingest accepted/s, 64 callers, 512 B (%s)", mode),
				value:     fmt.Sprintf("%.0f/s", med(kindIngest)),
				reference: fmt.Sprintf("%.0f/s minimal publishing handler", med(kindMinimal)),
				ratio:     fmt.Sprintf("%.2f", ratio),
				target:    fmt.Sprintf(">= %.2f", target),
				verdict:   verdict(ratio >= target),
			},
			row{
				figure:    fmt.Sprintf("  context: raw JetStream publishes / bare net/http 202 (%s)", mode),
				value:     fmt.Sprintf("%.0f/s / %.0f/s", med(kindRaw), med(kindBare)),
				reference: fmt.Sprintf("%.0f/s ingest", med(kindIngest)),
				ratio:     fmt.Sprintf("%.2f of raw", ratioOf(kindIngest, kindRaw)),
				target:    "-", verdict: "-",
			},
			row{
				figure:    fmt.Sprintf("  ingest with events off, not the default (%s)", mode),
				value:     fmt.Sprintf("%.0f/s", med(kindIngestNoEvents)),
				reference: fmt.Sprintf("%.0f/s minimal publishing handler; %.1f us CPU each, %.1f us with events", med(kindMinimal), median(cpu[kindIngestNoEvents]), median(cpu[kindIngest])),
				ratio:     fmt.Sprintf("%.2f", ratioOf(kindIngestNoEvents, kindMinimal)),
				target:    "-", verdict: "-",
			},
			row{
				figure:    fmt.Sprintf("  server CPU per request, ingest (%s)", mode),
				value:     fmt.Sprintf("%.1f us", median(cpu[kindIngest])),
				reference: fmt.Sprintf("%.1f us minimal handler, %.1f us raw publish", median(cpu[kindMinimal]), median(cpu[kindRaw])),
				ratio:     fmt.Sprintf("%.2f", median(cpu[kindMinimal])/median(cpu[kindIngest])),
				target:    "-", verdict: "-",
			},
			row{
				figure:    fmt.Sprintf("ingest over h2c, 64 callers on one connection (%s)", mode),
				value:     fmt.Sprintf("%.0f/s", med(kindH2C)),
				reference: fmt.Sprintf("%.0f/s HTTP/1.1, 64 connections", med(kindIngest)),
				ratio:     fmt.Sprintf("%.2f", ratioOf(kindH2C, kindIngest)),
				target:    "-", verdict: "-",
			})
		lat, err := ingestLatency(ctx, s, syncAlways, med(kindIngest)/2)
		if err != nil {
			return rows, err
		}
		rows = append(rows, lat)
	}
	return rows, nil
}

// ingestLatency measures the ingest's latency at half its rate (half), beside the
// minimal handler's at the same load.
func ingestLatency(ctx context.Context, s settings, syncAlways bool, half float64) (row, error) {
	mode := modeName(syncAlways)
	var lat [2]loadResult
	for i, kind := range []string{kindIngest, kindMinimal} {
		res, err := measureKind(ctx, kind, syncAlways, load{Workers: ingestWorkers, For: s.ingestFor, Rate: half})
		if err != nil {
			return row{}, fmt.Errorf("%s latency (%s): %w", kind, mode, err)
		}
		lat[i] = res
	}
	return row{
		figure:    fmt.Sprintf("ingest latency p50 / p99 at half that load, %.0f/s offered (%s)", half, mode),
		value:     ms(lat[0].P50) + " / " + ms(lat[0].P99),
		reference: ms(lat[1].P50) + " / " + ms(lat[1].P99) + " minimal handler",
		ratio:     "-", target: "-", verdict: "-",
	}, nil
}

// ingestRounds measures each kind of server in s.ingestRounds interleaved rounds: its
// requests a second (got) and the server process's CPU per request in microseconds (cpu),
// one figure a round.
func ingestRounds(ctx context.Context, s settings, syncAlways bool, log io.Writer) (got, cpu map[string][]float64, err error) {
	mode := modeName(syncAlways)
	got, cpu = map[string][]float64{}, map[string][]float64{}
	for round := range s.ingestRounds {
		// Every other round in the reverse order: a machine slowing down within a
		// round counts against each kind in turn.
		kinds := slices.Clone(ingestKinds)
		if s.ingestKinds != nil {
			kinds = slices.Clone(s.ingestKinds)
		}
		if round%2 == 1 {
			slices.Reverse(kinds)
		}
		for _, kind := range kinds {
			res, err := measureKind(ctx, kind, syncAlways, load{Workers: ingestWorkers, For: s.ingestFor})
			if err != nil {
				return got, cpu, fmt.Errorf("%s (%s): %w", kind, mode, err)
			}
			got[kind] = append(got[kind], res.rate(s.ingestFor))
			cpu[kind] = append(cpu[kind], float64(res.serverCPU.Microseconds())/float64(max(res.Count, 1)))
		}
		fmt.Fprintf(log, "bench: ingest (%s) round %d:", mode, round+1)
		for _, kind := range ingestKinds {
			if len(got[kind]) > round {
				fmt.Fprintf(log, " %s %.0f/s (%.1f us CPU each);", kind, got[kind][round], cpu[kind][round])
			}
		}
		fmt.Fprintln(log)
	}
	return got, cpu, nil
}

// measureKind starts a fresh node and the server kind names on it, and offers it l from
// the load generator process. The result says too how much CPU this process (the server:
// the node and the handler) took while the load ran.
func measureKind(ctx context.Context, kind string, syncAlways bool, l load) (loadResult, error) {
	var res loadResult
	err := withServer(ctx, kind, syncAlways, &l, func() error {
		before := cpuTime()
		var err error
		res, err = runLoad(ctx, l)
		res.serverCPU = cpuTime() - before
		return err
	})
	return res, err
}

// cpuTime is the CPU time this process took so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// withServer starts a fresh node and the server kind names on it, points l at it and
// runs measure.
func withServer(ctx context.Context, kind string, syncAlways bool, l *load, measure func() error) error {
	listen := ""
	if kind == kindRaw {
		listen = "127.0.0.1:-1"
	}
	n, err := startNodeListening(ctx, syncAlways, queue.Config{}, listen)
	if err != nil {
		return err
	}
	defer n.close()
	// Every HTTP server gets the same requests, the bearer token included: the ingest
	// checks it, the others read past it.
	l.Proto, l.Token = protoHTTP1, benchToken
	var h http.Handler
	switch kind {
	case kindRaw:
		l.Proto, l.Target = protoNATS, n.srv.ClientURL()
		return measure()
	case kindBare:
		h = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusAccepted) })
	case kindMinimal:
		if h, err = minimalHandler(n.nc); err != nil {
			return err
		}
	case kindIngest, kindH2C, kindIngestTraced, kindIngestNoEvents, kindIngestRepublished:
		cfg := ingest.Config{}
		if kind == kindIngestTraced {
			cfg.Tracing = tracedProvider
		}
		switch kind {
		case kindIngestNoEvents:
		case kindIngestRepublished:
			if err := republishAccepted(ctx, n); err != nil {
				return err
			}
			cfg.Status = n.q
		default: // as the binary runs it: accepted announced live
			cfg.Live, cfg.Status = n.q, n.q
		}
		if h, err = benchIngestWith(n, cfg); err != nil {
			return err
		}
		if kind == kindH2C {
			l.Proto = protoH2C
		}
	}
	url, stop, err := serveProto(h, l.Proto == protoH2C)
	if err != nil {
		return err
	}
	defer stop()
	l.Target = url + "/v1/requests"
	return measure()
}

// benchIngestWith is the project's ingest as the binary runs it, with cfg's events and
// tracing: its metrics counted, a bearer token required, a logger at info level.
func benchIngestWith(n *node, cfg ingest.Config) (http.Handler, error) {
	tokens, err := ingest.NewTokens("", []string{benchToken})
	if err != nil {
		return nil, err
	}
	cfg.Metrics, cfg.Tokens = ingest.NewMetrics(prometheus.NewRegistry()), tokens
	api, err := ingest.New(cfg, n.q, n.q, zerolog.New(io.Discard).Level(zerolog.InfoLevel))
	if err != nil {
		return nil, err
	}
	return api.Handler(), nil
}

// minimalHandler is the least an HTTP ingest on net/http must do: read the body, find
// the clientId (a plain search for its key, no JSON parsing), publish the body with a
// message id to the client's subject on the request stream, wait for the ack, answer
// 202. It checks nothing else.
func minimalHandler(nc *nats.Conn) (http.Handler, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	var seq atomic.Uint64
	key := []byte(`"clientId":"`)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		i := bytes.Index(b, key)
		if err != nil || i < 0 {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		client := b[i+len(key):]
		client = client[:max(bytes.IndexByte(client, '"'), 0)]
		msg := &nats.Msg{Subject: request.RequestSubject(string(client)), Data: b}
		id := strconv.FormatUint(seq.Add(1), 36)
		if _, err := js.PublishMsg(r.Context(), msg, jetstream.WithMsgID(id), jetstream.WithExpectStream(queue.RequestStream)); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}), nil
}

// republishAccepted has the request stream republish every stored request's headers
// (no body) on its client's accepted subject.
func republishAccepted(ctx context.Context, n *node) error {
	js, err := jetstream.New(n.nc)
	if err != nil {
		return err
	}
	st, err := js.Stream(ctx, queue.RequestStream)
	if err != nil {
		return err
	}
	cfg := st.CachedInfo().Config
	cfg.RePublish = &jetstream.RePublish{
		Source:      request.RequestPrefix + "*.*",
		Destination: request.EventPrefix + "{{wildcard(2)}}.accepted",
		HeadersOnly: true,
	}
	_, err = js.UpdateStream(ctx, cfg)
	return err
}
