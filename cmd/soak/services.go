package main

import (
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/penguinhq/dispatcher/pkg/fault"
)

// service is an ingest or a dispatcher process and its links to the NATS nodes, each
// through a fault proxy of its own.
type service struct {
	kind  string // "ingest" or "dispatcher"
	slot  int
	gen   int
	id    string // the dispatcher's INSTANCE_ID
	links []*fault.Proxy
	p     *proc
	addr  string // ingest: where the API listens
}

func newLinks(c *cluster) ([]*fault.Proxy, error) {
	var links []*fault.Proxy
	for _, nd := range c.nodes {
		p, err := fault.New(nd.client)
		if err != nil {
			return nil, err
		}
		links = append(links, p)
	}
	return links, nil
}

func linkURL(links []*fault.Proxy) string {
	var urls []string
	for _, l := range links {
		urls = append(urls, "nats://"+l.Addr())
	}
	return strings.Join(urls, ",")
}

// cut makes every link of the service fail: refused, or blackholed.
func (s *service) cut(blackhole bool) {
	for _, l := range s.links {
		if blackhole {
			l.Blackhole()
		} else {
			l.Refuse()
		}
	}
}

func (s *service) heal() {
	for _, l := range s.links {
		l.Heal()
	}
}

func (s *service) close() {
	if s.p != nil {
		s.p.Stop(syscall.SIGTERM, 20*time.Second)
	}
	for _, l := range s.links {
		l.Close()
	}
}

// run holds what the soak starts services with.
type run struct {
	dir          string
	ingestBin    string
	dispatchBin  string
	interval     time.Duration
	ravenURL     string
	ravenTimeout time.Duration
	leaseTTL     time.Duration
}

func (r *run) startIngest(c *cluster, slot int) (*service, error) {
	links, err := newLinks(c)
	if err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	ops, err := freeAddr()
	if err != nil {
		return nil, err
	}
	s := &service{kind: "ingest", slot: slot, links: links, addr: addr}
	s.p, err = startProc(r.dir, fmt.Sprintf("ingest-%d", slot), r.ingestBin, map[string]string{
		"NATS_URL": linkURL(links), "STREAM_REPLICAS": "3", "INGEST_ADDR": addr, "OPS_ADDR": ops,
		"DISPATCH_INTERVAL": r.interval.String(), "PUBLISH_TIMEOUT": "3s",
	})
	return s, err
}

// startDispatcher starts a dispatcher in slot, generation gen (each restart is a new
// instance with an id of its own).
func (r *run) startDispatcher(c *cluster, slot, gen int) (*service, error) {
	links, err := newLinks(c)
	if err != nil {
		return nil, err
	}
	ops, err := freeAddr()
	if err != nil {
		return nil, err
	}
	s := &service{kind: "dispatcher", slot: slot, gen: gen, id: fmt.Sprintf("d%d-%d", slot, gen), links: links}
	s.p, err = startProc(r.dir, s.id, r.dispatchBin, map[string]string{
		"NATS_URL": linkURL(links), "STREAM_REPLICAS": "3", "OPS_ADDR": ops, "INSTANCE_ID": s.id,
		"RAVEN_URL": r.ravenURL, "RAVEN_TIMEOUT": r.ravenTimeout.String(), "LEASE_TTL": r.leaseTTL.String(),
		"DISPATCH_INTERVAL": r.interval.String(), "RETRY_BACKOFF_BASE": "200ms", "RETRY_BACKOFF_MAX": "2s",
		"MAX_ATTEMPTS": "100000", "SHUTDOWN_GRACE": "5s",
	})
	return s, err
}
