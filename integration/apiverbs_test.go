package integration

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// The streams the verbs are tried on: the project's, and one it does not have.
var verbStreams = []string{queue.RequestStream, queue.DeadLetterStream, queue.EventStream, queue.HealthStream,
	"KV_" + queue.LeaseBucket, "KV_" + queue.ControlBucket, "OTHER"}

// streamVerbs is every JetStream verb on a stream (%s): each request of the API that
// names it, and the flow-control, ack and snapshot subjects of its consumers.
var streamVerbs = [][2]string{
	{"STREAM.INFO", "$JS.API.STREAM.INFO.%s"},
	{"STREAM.CREATE", "$JS.API.STREAM.CREATE.%s"},
	{"STREAM.UPDATE", "$JS.API.STREAM.UPDATE.%s"},
	{"STREAM.DELETE", "$JS.API.STREAM.DELETE.%s"},
	{"STREAM.PURGE", "$JS.API.STREAM.PURGE.%s"},
	{"STREAM.MSG.GET", "$JS.API.STREAM.MSG.GET.%s"},
	{"STREAM.MSG.DELETE", "$JS.API.STREAM.MSG.DELETE.%s"},
	{"STREAM.SNAPSHOT", "$JS.API.STREAM.SNAPSHOT.%s"},
	{"STREAM.RESTORE", "$JS.API.STREAM.RESTORE.%s"},
	{"STREAM.LEADER.STEPDOWN", "$JS.API.STREAM.LEADER.STEPDOWN.%s"},
	{"STREAM.PEER.REMOVE", "$JS.API.STREAM.PEER.REMOVE.%s"},
	{"STREAM.PEER.EVACUATE", "$JS.API.STREAM.PEER.EVACUATE.%s"},
	{"STREAM.CANCEL_MOVE", "$JS.API.STREAM.CANCEL_MOVE.%s"},
	{"ACCOUNT.STREAM.MOVE", "$JS.API.ACCOUNT.STREAM.MOVE.DISPATCH.%s"},
	{"ACCOUNT.STREAM.CANCEL_MOVE", "$JS.API.ACCOUNT.STREAM.CANCEL_MOVE.DISPATCH.%s"},
	{"DIRECT.GET", "$JS.API.DIRECT.GET.%s"},
	{"DIRECT.GET (last by subject)", "$JS.API.DIRECT.GET.%s.dispatch.x"},
	{"CONSUMER.CREATE (unnamed)", "$JS.API.CONSUMER.CREATE.%s"},
	{"CONSUMER.CREATE", "$JS.API.CONSUMER.CREATE.%s.c"},
	{"CONSUMER.CREATE (filtered)", "$JS.API.CONSUMER.CREATE.%s.c.dispatch.x"},
	{"CONSUMER.DURABLE.CREATE", "$JS.API.CONSUMER.DURABLE.CREATE.%s.c"},
	{"CONSUMER.INFO", "$JS.API.CONSUMER.INFO.%s.c"},
	{"CONSUMER.DELETE", "$JS.API.CONSUMER.DELETE.%s.c"},
	{"CONSUMER.NAMES", "$JS.API.CONSUMER.NAMES.%s"},
	{"CONSUMER.LIST", "$JS.API.CONSUMER.LIST.%s"},
	{"CONSUMER.MSG.NEXT", "$JS.API.CONSUMER.MSG.NEXT.%s.c"},
	{"CONSUMER.PAUSE", "$JS.API.CONSUMER.PAUSE.%s.c"},
	{"CONSUMER.RESET", "$JS.API.CONSUMER.RESET.%s.c"},
	{"CONSUMER.UNPIN", "$JS.API.CONSUMER.UNPIN.%s.c"},
	{"CONSUMER.LEADER.STEPDOWN", "$JS.API.CONSUMER.LEADER.STEPDOWN.%s.c"},
	{"CONSUMER.PEER.REMOVE", "$JS.API.CONSUMER.PEER.REMOVE.%s.c"},
	{"CONSUMER.PEER.EVACUATE", "$JS.API.CONSUMER.PEER.EVACUATE.%s.c"},
	{"FC", "$JS.FC.%s.c.1"},
	{"ACK", "$JS.ACK.%s.c.1.1.1.1.0"},
	{"SNAPSHOT.ACK", "$JS.SNAPSHOT.ACK.%s.x"},
	{"SNAPSHOT.RESTORE", "$JS.SNAPSHOT.RESTORE.%s.x"},
}

// accountVerbs is every JetStream verb of the account or the servers, and a subject of
// the API that names nothing it has.
var accountVerbs = [][2]string{
	{"ACCOUNT.INFO", "$JS.API.INFO"},
	{"STREAM.NAMES", "$JS.API.STREAM.NAMES"},
	{"STREAM.LIST", "$JS.API.STREAM.LIST"},
	{"STREAM.TEMPLATE.NAMES", "$JS.API.STREAM.TEMPLATE.NAMES"},
	{"ACCOUNT.PURGE", "$JS.API.ACCOUNT.PURGE.DISPATCH"},
	{"META.LEADER.STEPDOWN", "$JS.API.META.LEADER.STEPDOWN"},
	{"META.RESCUE", "$JS.API.META.RESCUE"},
	{"SERVER.REMOVE", "$JS.API.SERVER.REMOVE"},
	{"SERVER.EVACUATE", "$JS.API.SERVER.EVACUATE"},
	{"unknown", "$JS.API.X"},
}

// writeVerbs are the writes to each stream: a message on its subjects.
var writeVerbs = map[string][][2]string{
	queue.RequestStream:    {{"write request", request.RequestPrefix + "YWxpY2U"}, {"write outcome", request.OutcomePrefix + "YWxpY2U"}},
	queue.DeadLetterStream: {{"write dead letter", request.DeadLetterPrefix + "YWxpY2U"}},
	queue.EventStream: {{"write accepted", request.EventPrefix + "YWxpY2U.accepted"}, {"write replayed", request.EventPrefix + "YWxpY2U.replayed"},
		{"write delivered", request.EventPrefix + "YWxpY2U.delivered"}},
	queue.HealthStream: {{"write ingest's", queue.HealthSubject(queue.RoleIngest)}, {"write dispatcher's", queue.HealthSubject(queue.RoleDispatcher)},
		{"write ops'", queue.HealthSubject(queue.RoleOps)}},
	"KV_" + queue.LeaseBucket:   {{"write", "$KV." + queue.LeaseBucket + ".k"}},
	"KV_" + queue.ControlBucket: {{"write", "$KV." + queue.ControlBucket + ".k"}},
}

// reads is what reading a stream takes: its info, gets by sequence and by subject,
// named consumers (created, asked for, deleted, pulled from, flow control).
var reads = []string{"STREAM.INFO", "STREAM.MSG.GET", "DIRECT.GET", "DIRECT.GET (last by subject)", "CONSUMER.CREATE",
	"CONSUMER.CREATE (filtered)", "CONSUMER.INFO", "CONSUMER.DELETE", "CONSUMER.MSG.NEXT", "FC"}

// The JetStream verbs each shipped NATS user may use, on each stream ("" for the
// account's): every other is refused. Written out here, not taken from pkg/queue, so that
// a change to a role's list shows up as a change to this table.
var userVerbs = map[string]map[string][]string{
	"ingest": {
		"":                     {"ACCOUNT.INFO"},
		queue.RequestStream:    {"STREAM.INFO", "write request"},
		queue.DeadLetterStream: {"STREAM.INFO"},
		queue.EventStream:      {"STREAM.INFO", "DIRECT.GET", "DIRECT.GET (last by subject)", "write accepted"},
		// its test write: a marker of its own, and the removal of a missing one
		queue.HealthStream: {"STREAM.INFO", "STREAM.MSG.DELETE", "write ingest's"},
	},
	"dispatcher": {
		"":                          {"ACCOUNT.INFO"},
		queue.RequestStream:         append(slices.Clone(reads), "STREAM.CREATE", "STREAM.UPDATE", "STREAM.MSG.DELETE", "write request", "write outcome"),
		queue.DeadLetterStream:      append(slices.Clone(reads), "STREAM.CREATE", "STREAM.UPDATE", "STREAM.MSG.DELETE", "write dead letter"),
		queue.EventStream:           append(slices.Clone(reads), "STREAM.CREATE", "STREAM.UPDATE", "write accepted", "write replayed", "write delivered"),
		"KV_" + queue.LeaseBucket:   append(slices.Clone(reads), "STREAM.CREATE", "STREAM.UPDATE", "write"),
		"KV_" + queue.ControlBucket: append(slices.Clone(reads), "STREAM.CREATE", "STREAM.UPDATE", "write"),
		queue.HealthStream:          {"STREAM.INFO", "STREAM.CREATE", "STREAM.UPDATE"},
	},
	"ops": {
		"":                          {"ACCOUNT.INFO"},
		queue.RequestStream:         append(slices.Clone(reads), "write request"), // replay puts a request back
		queue.DeadLetterStream:      append(slices.Clone(reads), "STREAM.MSG.DELETE"),
		queue.EventStream:           append(slices.Clone(reads), "write replayed"),
		"KV_" + queue.LeaseBucket:   reads,
		"KV_" + queue.ControlBucket: append(slices.Clone(reads), "STREAM.CREATE", "write"),
	},
	"penguin-acme": {}, // the shipped example of a producer's user: nothing
}

// shippedExample uncomments the shipped nats.conf's example of a producer's user
// (penguin-acme), and gives it a password.
func shippedExample(t testing.TB, conf string) string {
	t.Helper()
	re := regexp.MustCompile(`(?m)^(\s*)# (\{ user: penguin-acme, .*)\n\s*# (\s*permissions: .*)$`)
	if !re.MatchString(conf) {
		t.Fatal("the shipped nats.conf has no commented example user penguin-acme")
	}
	conf = re.ReplaceAllString(conf, "$1$2\n$1$3")
	return strings.ReplaceAll(conf, "$PENGUIN_ACME_NATS_PASSWORD", `"pw-penguin"`)
}

// refusedPublishes is the subjects the server refused u to publish to so far, in lower
// case (as nats.go reports them).
func (u *natsUser) refusedPublishes() map[string]bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := map[string]bool{}
	re := regexp.MustCompile(`permissions violation for publish to "(.*)"`)
	for _, e := range u.errs {
		if m := re.FindStringSubmatch(strings.ToLower(e)); m != nil {
			out[m[1]] = true
		}
	}
	return out
}

// The JetStream verbs of each shipped NATS user (deployments/nats/nats.conf, the
// producer's example user uncommented): for every verb of the API on each of the
// project's streams (and one it does not have), every verb of the account, and every
// write to a stream's subjects, the server allows exactly those on the user's list
// (userVerbs) and refuses every other one as a permissions violation (issue 59, finding
// 1). First the attack that finding found: ingest, which learns a queued request's
// sequence from its accepted event, may not remove it from the request stream, nor roll
// its subject up; the request is still queued.
func TestEachNATSUserMayUseOnlyItsJetStreamVerbs(t *testing.T) {
	t.Parallel()
	srv, _ := shippedNATS(t, "      { user: harness, password: harness }\n", shippedExample)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	harness, err := nats.Connect(srv.ClientURL(), nats.Timeout(queuetest.DialTimeout), nats.UserInfo("harness", "harness"))
	if err != nil {
		t.Fatal(err)
	}
	defer harness.Close()
	q, err := queuetest.Open(ctx, harness, queue.Config{}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	queued, err := q.Publish(ctx, request.Request{ID: "r1", ClientID: "alice", ContentType: "application/json", Body: []byte(`{"n":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(harness)
	reqs, err := js.Stream(ctx, queue.RequestStream)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("IngestCannotRemoveAQueuedRequest", func(t *testing.T) {
		ingest := connectAs(t, srv, "ingest", "pw-ingest", queue.InboxPrefix(queue.RoleIngest))
		ingest.mayNotPublish("$JS.API.STREAM.MSG.DELETE."+queue.RequestStream, fmt.Sprintf(`{"seq":%d}`, queued.Seq))
		ingest.mayNotPublish("$JS.API.STREAM.MSG.DELETE."+queue.RequestStream, fmt.Sprintf(`{"seq":%d,"no_erase":true}`, queued.Seq))
		ingest.mayNotPublish("$JS.API.STREAM.PURGE."+queue.RequestStream, fmt.Sprintf(`{"seq":%d}`, queued.Seq+1))
		// A rollup on the request's subject would purge it: the stream takes none.
		ijs, _ := jetstream.New(ingest.nc)
		rollup := nats.NewMsg(request.RequestPrefix + request.EncodeClientID("alice"))
		rollup.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
		rollup.Data = []byte(`{}`)
		if _, err := ijs.PublishMsg(ctx, rollup); err == nil || !strings.Contains(err.Error(), "rollup not permitted") {
			t.Errorf("ingest's rollup of alice's queue: %v, want it refused", err)
		}
		ingest.checks.Wait()
		if m, err := reqs.GetMsg(ctx, queued.Seq); err != nil || m.Header.Get(request.HeaderID) != "r1" {
			t.Fatalf("the queued request at sequence %d after ingest's attempts: %v, want it still there", queued.Seq, err)
		}
	})

	users := map[string]struct{ password, inbox string }{
		"ingest":       {"pw-ingest", queue.InboxPrefix(queue.RoleIngest)},
		"dispatcher":   {"pw-dispatcher", queue.InboxPrefix(queue.RoleDispatcher)},
		"ops":          {"pw-ops", queue.InboxPrefix(queue.RoleOps)},
		"penguin-acme": {"pw-penguin", "_INBOX_penguin"},
	}
	for user, allowed := range userVerbs {
		t.Run(user, func(t *testing.T) {
			type verb struct{ stream, name, subject string }
			var verbs []verb
			for _, v := range accountVerbs {
				verbs = append(verbs, verb{"", v[0], v[1]})
			}
			for _, s := range verbStreams {
				for _, v := range append(slices.Clone(streamVerbs), writeVerbs[s]...) {
					subject := v[1]
					if strings.Contains(subject, "%s") {
						subject = fmt.Sprintf(subject, s)
					}
					verbs = append(verbs, verb{s, v[0], subject})
				}
			}
			for s, names := range allowed { // a typo in the table would pass unseen
				for _, name := range names {
					if !slices.ContainsFunc(verbs, func(v verb) bool { return v.stream == s && v.name == name }) {
						t.Fatalf("the table lets %s use %q on %q, which is no verb here", user, name, s)
					}
				}
			}

			u := connectAs(t, srv, user, users[user].password, users[user].inbox)
			// Every verb at once, as a request whose body no API acts on (not JSON, not
			// empty), then one that every user is refused: the server answers in order,
			// so once its refusal is in, every refusal is.
			reply := u.nc.NewRespInbox()
			for _, v := range verbs {
				if err := u.nc.PublishRequest(v.subject, reply, []byte("not json")); err != nil {
					t.Fatal(err)
				}
			}
			const last = "dispatch.verbs.done"
			if err := u.nc.Publish(last, nil); err != nil {
				t.Fatal(err)
			}
			if err := u.nc.Flush(); err != nil {
				t.Fatal(err)
			}
			if !u.refusedTo("publish", last) {
				t.Fatalf("%s: the server did not refuse %s", user, last)
			}
			refused := u.refusedPublishes()
			for _, v := range verbs {
				may := slices.Contains(allowed[v.stream], v.name)
				where := v.stream
				if where == "" {
					where = "the account"
				}
				switch was := refused[strings.ToLower(v.subject)]; {
				case may && was:
					t.Errorf("%s may use %s on %s, and was refused (%s)", user, v.name, where, v.subject)
				case !may && !was:
					t.Errorf("%s may not use %s on %s, and was allowed to (%s)", user, v.name, where, v.subject)
				}
			}
		})
	}
}
