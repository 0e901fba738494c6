package queue

import (
	"fmt"
	"slices"
	"strings"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Role is a NATS user's job. Each service connects as its own user, and each user may do
// only what its job needs (RolePermissions): deployments/nats/nats.conf, the Kubernetes
// values and the standalone's listening server give each user exactly these.
type Role string

// The roles.
const (
	// RoleIngest takes requests: it publishes them and their accepted events, reads the
	// events for statuses, and asks the
	// dispatchers to cancel a request (the owner of its client decides, removes it and
	// writes its final event). It cannot read a queued body or a dead letter, nor touch
	// leases or steering, and it can remove nothing from the request, dead-letter and
	// events streams, nor create, change, purge or delete a stream or consumer (a stream
	// it created could source the queued requests, bodies and all: it opens the streams a
	// dispatcher created, and waits for them). Its test write
	// (WatchWrites, every 2 s: whether the store takes writes while no request arrives) is
	// a marker on its own subject of the health stream (HealthSubject), and the removal
	// of one that does not exist there, which is how a failed store's error is read back;
	// that stream holds the markers and nothing else. None of the streams it writes to
	// takes the headers that remove other messages (rollups, per-message TTLs, schedules).
	RoleIngest Role = "ingest"
	// RoleDispatcher reads and removes requests, writes dead letters, events (and final
	// events kept in the request stream while the events stream does not take them) and its
	// leases, reads steering, answers operators' questions, and serves the admin API and the
	// console (so it also steers, replays and purges for the operators signed in there,
	// and asks for the servers' JetStream report for their status page).
	RoleDispatcher Role = "dispatcher"
	// RoleOps is dispatchctl: steering, dead letters (read, replay: it puts a request back
	// and writes its replayed event), purge (asked of the dispatchers through steering),
	// cancel (asked of the dispatchers, which remove the request and write its event),
	// inspection, and the servers' JetStream report. It reads leases but cannot write
	// them; it cannot remove a queued request, write a dead letter or another event, nor
	// create, change or delete streams (but for the steering bucket, which it creates if
	// no dispatcher has yet).
	RoleOps Role = "ops"
)

// Roles lists the roles, in the order the deployments list their users.
var Roles = []Role{RoleIngest, RoleDispatcher, RoleOps}

// InboxPrefix is where the replies to a role's requests arrive. Each role has its own,
// and may subscribe only there: with the shared default (_INBOX) any user could
// subscribe to every reply, the bodies other users read among them.
func InboxPrefix(r Role) string { return "_INBOX_" + string(r) }

// Permissions is what a NATS user may publish and subscribe to. Responses lets it answer
// the requests it received (the reply subjects of messages it was delivered).
type Permissions struct {
	Publish   []string
	Subscribe []string
	Responses bool
}

// The streams, as the JetStream API names them.
var (
	kvLeases  = "KV_" + LeaseBucket
	kvControl = "KV_" + ControlBucket
)

// RolePermissions is the allow-list of a role. Anything not listed is refused by the
// server (a publish is dropped, a subscription refused, both reported to the client).
func RolePermissions(r Role) Permissions {
	switch r {
	case RoleIngest:
		return Permissions{
			Publish: join(
				[]string{request.RequestPrefix + "*", request.EventPrefix + "*." + string(request.EventAccepted), "$JS.API.INFO", queuedSubject, cancelSubject,
					HealthSubject(r)},
				api(RequestStream, "STREAM.INFO"),
				api(DeadLetterStream, "STREAM.INFO"),
				api(EventStream, "STREAM.INFO", "DIRECT.GET"),
				api(HealthStream, "STREAM.INFO", "STREAM.MSG.DELETE"),
			),
			Subscribe: []string{InboxPrefix(r) + ".>", request.EventPrefix + ">"},
		}
	case RoleDispatcher:
		return Permissions{
			Publish: join(
				[]string{request.RequestPrefix + "*", request.DeadLetterPrefix + "*", request.EventPrefix + ">", request.OutcomePrefix + "*", "$JS.API.INFO",
					"$KV." + LeaseBucket + ".>", "$KV." + ControlBucket + ".>", "$SYS.REQ.ACCOUNT.PING.STATZ", questionSubject,
					MetaSubject, cancelSubject},
				api(RequestStream, managed...), api(RequestStream, reads...), api(RequestStream, "STREAM.MSG.DELETE"),
				api(DeadLetterStream, managed...), api(DeadLetterStream, reads...), api(DeadLetterStream, "STREAM.MSG.DELETE"),
				api(EventStream, managed...), api(EventStream, reads...),
				api(kvLeases, managed...), api(kvLeases, reads...),
				api(kvControl, managed...), api(kvControl, reads...),
				// created and kept in line with the others; its test writes are removals
				// from the request stream, which also prove its head reads' link (link.go)
				api(HealthStream, managed...),
			),
			Subscribe: []string{InboxPrefix(r) + ".>", request.EventPrefix + ">", questionSubject, queuedSubject, cancelSubject},
			Responses: true,
		}
	case RoleOps:
		return Permissions{
			Publish: join(
				[]string{request.RequestPrefix + "*", request.EventPrefix + "*." + string(request.EventReplayed), "$JS.API.INFO",
					"$KV." + ControlBucket + ".>", "$SYS.REQ.ACCOUNT.PING.STATZ", MetaSubject, questionSubject, cancelSubject},
				api(RequestStream, "STREAM.INFO"), api(RequestStream, reads...),
				api(DeadLetterStream, "STREAM.INFO"), api(DeadLetterStream, reads...), api(DeadLetterStream, "STREAM.MSG.DELETE"),
				api(EventStream, "STREAM.INFO"), api(EventStream, reads...),
				api(kvLeases, "STREAM.INFO"), api(kvLeases, reads...),
				// the steering bucket, created if no dispatcher has yet (as it would be)
				api(kvControl, "STREAM.INFO", "STREAM.CREATE"), api(kvControl, reads...),
			),
			Subscribe: []string{InboxPrefix(r) + ".>", request.EventPrefix + ">"},
		}
	}
	return Permissions{}
}

// PenguinPermissions is a read-only user for a producer that follows its own clients'
// events (docs/producers.md): it may subscribe to those clients' events and nothing
// else, and publish nothing.
func PenguinPermissions(clientIDs ...string) Permissions {
	p := Permissions{Publish: []string{}}
	for _, id := range clientIDs {
		p.Subscribe = append(p.Subscribe, request.EventPrefix+request.EncodeClientID(id)+".>")
	}
	return p
}

// managed is what creating and keeping a stream in line with the config takes; reads is
// what reading it takes (stream info, gets, consumers and their messages, acks and flow
// control).
var (
	managed = []string{"STREAM.INFO", "STREAM.CREATE", "STREAM.UPDATE"}
	reads   = []string{"STREAM.INFO", "STREAM.MSG.GET", "DIRECT.GET", "CONSUMER"}
)

// api turns JetStream operations on stream into the subjects that ask for them.
func api(stream string, ops ...string) []string {
	var out []string
	for _, op := range ops {
		switch op {
		case "DIRECT.GET":
			// a get by sequence, and one by subject (the subject follows the stream name)
			out = append(out, "$JS.API.DIRECT.GET."+stream, "$JS.API.DIRECT.GET."+stream+".>")
		case "CONSUMER":
			// create (named, with its filter), info, delete, next message (pull
			// consumers); and the flow-control replies of push ones (KV watches)
			for _, c := range []string{"CREATE", "INFO", "DELETE", "MSG.NEXT"} {
				out = append(out, "$JS.API.CONSUMER."+c+"."+stream+".>")
			}
			out = append(out, "$JS.FC."+stream+".>")
		default:
			out = append(out, "$JS.API."+op+"."+stream)
		}
	}
	return out
}

// join is the subjects of every list, each once, in the order first seen.
func join(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		for _, s := range l {
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// Conf is p in nats.conf's syntax, as the value of a user's permissions.
func (p Permissions) Conf(indent string) string {
	var b strings.Builder
	list := func(name string, subjects []string) {
		if len(subjects) == 0 {
			fmt.Fprintf(&b, "%s%s: { deny: [\">\"] }\n", indent, name)
			return
		}
		fmt.Fprintf(&b, "%s%s: { allow: [\n", indent, name)
		for _, s := range subjects {
			fmt.Fprintf(&b, "%s  %q\n", indent, s)
		}
		fmt.Fprintf(&b, "%s] }\n", indent)
	}
	list("publish", p.Publish)
	list("subscribe", p.Subscribe)
	if p.Responses {
		fmt.Fprintf(&b, "%sallow_responses: true\n", indent)
	}
	return b.String()
}
