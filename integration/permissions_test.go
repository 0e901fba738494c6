package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/penguinhq/dispatcher/client"
	"github.com/penguinhq/dispatcher/integration/itest"
	"github.com/penguinhq/dispatcher/pkg/ledger"
	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// serverLog keeps what a server logged, for the permission violations it reports.
type serverLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *serverLog) add(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, v...))
}
func (l *serverLog) Noticef(format string, v ...any) { l.add(format, v...) }
func (l *serverLog) Warnf(format string, v ...any)   { l.add(format, v...) }
func (l *serverLog) Fatalf(format string, v ...any)  { l.add(format, v...) }
func (l *serverLog) Errorf(format string, v ...any)  { l.add(format, v...) }
func (l *serverLog) Debugf(format string, v ...any)  {}
func (l *serverLog) Tracef(format string, v ...any)  {}

// violations returns the permission violations logged so far.
func (l *serverLog) violations() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, s := range l.lines {
		if strings.Contains(s, "Violation") {
			out = append(out, s)
		}
	}
	return out
}

// The passwords the test gives the shipped configuration's users.
var rolePasswords = map[string]string{"INGEST": "pw-ingest", "DISPATCHER": "pw-dispatcher", "OPS": "pw-ops", "SYS": "pw-sys"}

// shippedNATS starts one node of deployments/nats/nats.conf as operators run it, its
// users and their permissions as written there, with extra users added to the services'
// account (the test's own, unrestricted, to check the queue with; a producer's), the
// cluster block left out, listening on loopback and storing in a temporary directory.
// Each edit, if any, changes the file's text first (shippedExample: a commented example).
func shippedNATS(t testing.TB, extraUsers string, edits ...func(testing.TB, string) string) (*server.Server, *serverLog) {
	t.Helper()
	raw, err := os.ReadFile("../deployments/nats/nats.conf")
	if err != nil {
		t.Fatal(err)
	}
	conf := string(raw)
	for _, edit := range edits {
		conf = edit(t, conf)
	}
	conf = regexp.MustCompile(`(?ms)^cluster \{.*?^\}\n`).ReplaceAllString(conf, "")
	for role, pw := range rolePasswords {
		conf = strings.ReplaceAll(conf, "$"+role+"_NATS_PASSWORD", fmt.Sprintf("%q", pw))
	}
	conf = strings.ReplaceAll(conf, "$NATS_SERVER_NAME", "perm-test")
	conf = strings.Replace(conf, "    users: [\n", "    users: [\n"+extraUsers, 1)
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("the shipped nats.conf: %v", err)
	}
	opts.Host, opts.Port = "127.0.0.1", -1
	opts.HTTPHost, opts.HTTPPort = "", 0
	opts.StoreDir = t.TempDir()
	opts.NoSigs, opts.NoLog = true, false
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	log := &serverLog{}
	s.SetLogger(log, false, false)
	s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(30 * time.Second) {
		t.Fatal("the shipped nats.conf's server did not get ready")
	}
	return s, log
}

// natsUser is a connection as one user, with what the server refused it.
type natsUser struct {
	t      testing.TB
	name   string
	nc     *nats.Conn
	mu     sync.Mutex
	errs   []string
	checks sync.WaitGroup // mayNotPublish's, side by side
}

func connectAs(t testing.TB, s *server.Server, user, password, inboxPrefix string) *natsUser {
	t.Helper()
	u := &natsUser{t: t, name: user}
	nc, err := nats.Connect(s.ClientURL(), nats.Timeout(queuetest.DialTimeout), nats.UserInfo(user, password), nats.CustomInboxPrefix(inboxPrefix),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			u.mu.Lock()
			defer u.mu.Unlock()
			u.errs = append(u.errs, err.Error())
		}))
	if err != nil {
		t.Fatalf("connecting as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	t.Cleanup(u.checks.Wait) // before the connection closes
	u.nc = nc
	return u
}

// refusedTo waits a moment for the server to have refused what names subject.
func (u *natsUser) refusedTo(what, subject string) bool {
	ok, _ := itest.Poll(5*time.Second, func() (bool, string) {
		u.mu.Lock()
		defer u.mu.Unlock()
		for _, e := range u.errs {
			if strings.Contains(strings.ToLower(e), "permissions violation for "+what+" to \""+strings.ToLower(subject)+"\"") {
				return true, ""
			}
		}
		return false, ""
	})
	return ok
}

// mayNotPublish checks that a publish (a JetStream API call, a key write) to subject is
// refused, and that no answer came: an answer would carry what the user may not see.
// The check runs on its own goroutine, and the test waits for every one at its end: a
// refused request waits out its 2 s for an answer, and one after the other the
// permission test's 33 took over a minute.
func (u *natsUser) mayNotPublish(subject, body string) {
	u.checks.Go(func() {
		msg, err := u.nc.Request(subject, []byte(body), 2*time.Second)
		if err == nil {
			u.t.Errorf("%s: %s was answered: %.300s", u.name, subject, msg.Data)
			return
		}
		if !u.refusedTo("publish", subject) {
			u.t.Errorf("%s: a publish to %s was not refused by the server (%v)", u.name, subject, err)
		}
	})
}

// mayNotSubscribe checks that a subscription to subject is refused.
func (u *natsUser) mayNotSubscribe(subject string) {
	u.t.Helper()
	if _, err := u.nc.SubscribeSync(subject); err != nil {
		u.t.Fatal(err)
	}
	_ = u.nc.Flush()
	if !u.refusedTo("subscription", subject) {
		u.t.Errorf("%s: a subscription to %s was not refused by the server", u.name, subject)
	}
}

// The shipped NATS users (deployments/nats/nats.conf) each do only their own job (issue
// 35, finding 1). The binaries run as ingest, dispatcher and ops through everything they
// do (take, send, dead-letter, statuses, steering, replay, status, questions to the dispatchers) with no
// permission violation; then each user is refused what another's job is: reading a queued
// body or a dead letter, writing leases or steering (a forged pause), changing streams,
// subscribing to another's replies; and a producer's user follows its own clients' events
// and no one else's.
func TestEachNATSUserDoesOnlyItsJob(t *testing.T) {
	t.Parallel()
	const penguinPassword = "pw-penguin"
	penguin := queue.PenguinPermissions("alice")
	srv, slog := shippedNATS(t, fmt.Sprintf("      { user: harness, password: harness }\n      { user: penguin, password: %q, permissions: {\n%s      } }\n",
		penguinPassword, penguin.Conf("        ")))

	// The test's own view of the queue is the unrestricted harness user's.
	const interval = 200 * time.Millisecond
	url := func(user string) string {
		return strings.Replace(srv.ClientURL(), "nats://", "nats://"+user+":"+map[string]string{"harness": "harness", "ingest": "pw-ingest",
			"dispatcher": "pw-dispatcher", "ops": "pw-ops"}[user]+"@", 1)
	}
	s := newStack(t, options{interval: interval, noStart: true, natsURL: url("harness"), respond: func(a ledger.Arrival) ledger.Response {
		if a.ClientID == "dora" {
			return ledger.Response{Status: 400}
		}
		return ledger.Response{}
	}})

	// The follower's subscription, made before anything is sent.
	follower := connectAs(t, srv, "penguin", penguinPassword, "_INBOX_penguin")
	own, err := follower.nc.SubscribeSync(request.EventPrefix + request.EncodeClientID("alice") + ".>")
	if err != nil {
		t.Fatal(err)
	}

	ingestAddr, opsAddr := freeAddr(t), freeAddr(t)
	startBin(t, ingestBin, map[string]string{"NATS_URL": url("ingest"), "INGEST_ADDR": ingestAddr})
	startProc(t, map[string]string{"NATS_URL": url("dispatcher"), "RAVEN_URL": s.ravenURL, "DISPATCH_INTERVAL": interval.String(),
		"LEASE_TTL": "2s", "RAVEN_TIMEOUT": "1s", "OPS_ADDR": opsAddr, "ADMIN_TOKEN": "admin-token-0123456789abcdef0123456"})
	waitReady(t, "http://"+ingestAddr)
	waitReady(t, "http://"+opsAddr)
	s.ingestURL = "http://" + ingestAddr + "/v1/requests"
	var ids []string
	for n := range 3 {
		for _, c := range []string{"alice", "bob", "dora"} {
			ids = append(ids, s.post(c, n))
		}
	}
	s.waitDone(time.Minute)
	// Status reads, one waiting for the end (ingest reads the events).
	pc, err := client.New("http://"+ingestAddr, client.WithHTTPClient(itest.HTTP))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if st, err := pc.Wait(ctx, "alice", ids[0]); err != nil || st.State != client.StatusDelivered {
		t.Errorf("alice's first request reads %q (%v), want delivered", st.State, err)
	}
	if st, err := pc.Status(ctx, "dora", ids[2]); err != nil || st.State != client.StatusDeadLettered {
		t.Errorf("dora's first request reads %q (%v), want dead-lettered", st.State, err)
	}
	// A request whose record has gone (STATUS_RETENTION) while it waits is found queued:
	// ingest's user asks, the dispatcher's answers from the queue.
	lateUntil := time.Now().Add(20 * time.Second)
	late := s.postRaw(http.Header{"Content-Type": {"application/json"}, "Not-Before": {lateUntil.UTC().Format(time.RFC3339)}},
		[]byte(`{"clientId":"erin"}`)).str("id")
	s.accept("erin", late)
	s.hasNoRecord(ctx, "erin", late)
	if st, err := pc.Status(ctx, "erin", late); time.Now().Before(lateUntil.Add(-5*time.Second)) && (err != nil || st.State != client.StatusQueued || st.NotBefore.IsZero()) {
		t.Errorf("erin's delayed request without its record reads %+v (%v), want queued with its Not-Before", st, err)
	}

	// ops: dispatchctl, as the README runs it, through its commands.
	ctl := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(ctlBin, args...)
		cmd.Env = []string{"NATS_URL=" + url("ops"), "PATH=" + os.Getenv("PATH")}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("dispatchctl %q as ops: %v\n%s", args, err, out)
		}
		return string(out)
	}
	ctl("status")
	ctl("clients")
	ctl("steering")
	ctl("budget")
	ctl("request", ids[0])
	ctl("pause", "bob")
	ctl("resume", "bob")
	ctl("client-interval", "bob", "300ms")
	ctl("client-interval", "bob", "default")
	itest.MustContain(t, ctl("deadletters", "-client", "dora", "-body"), "dora")
	ctl("replay", "-client", "dora")
	s.markReplayed(ids[2], ids[5], ids[8])
	s.waitDone(time.Minute)
	if v := slog.violations(); len(v) > 0 {
		t.Fatalf("the services met permission violations doing their jobs:\n%s", strings.Join(v, "\n"))
	}
	// The follower saw alice's events, and only hers.
	got, err := own.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("the producer's user saw no event of its own client: %v", err)
	}
	if tok := strings.Split(got.Subject, ".")[2]; tok != request.EncodeClientID("alice") {
		t.Errorf("the producer's user got %s", got.Subject)
	}

	// What each user may not do.
	bodyOfAnother := `{"seq":1}`
	ingest := connectAs(t, srv, "ingest", "pw-ingest", queue.InboxPrefix(queue.RoleIngest))
	for _, subj := range []string{"$JS.API.STREAM.MSG.GET." + queue.RequestStream, "$JS.API.DIRECT.GET." + queue.RequestStream,
		"$JS.API.STREAM.MSG.GET." + queue.DeadLetterStream, "$JS.API.DIRECT.GET." + queue.DeadLetterStream,
		"$JS.API.CONSUMER.CREATE." + queue.RequestStream, "$JS.API.CONSUMER.CREATE." + queue.DeadLetterStream,
		"$JS.API.STREAM.DELETE." + queue.RequestStream, "$JS.API.STREAM.PURGE." + queue.RequestStream,
		"$JS.API.STREAM.UPDATE." + queue.RequestStream, "$JS.API.STREAM.MSG.DELETE." + queue.DeadLetterStream,
		"$JS.API.STREAM.PURGE.KV_" + queue.LeaseBucket, "$JS.API.STREAM.MSG.GET.KV_" + queue.ControlBucket,
	} {
		ingest.mayNotPublish(subj, bodyOfAnother)
	}
	// A forged pause, a lease written or deleted: key writes into the buckets.
	ingest.mayNotPublish("$KV."+queue.ControlBucket+".client."+request.EncodeClientID("bob"), `{"paused":true,"by":"dispatchctl alice@ops-laptop"}`)
	ingest.mayNotPublish("$KV."+queue.LeaseBucket+".p.1", `x`)
	ingest.mayNotPublish(request.DeadLetterPrefix+request.EncodeClientID("bob"), `x`)
	ingest.mayNotPublish(request.EventPrefix+request.EncodeClientID("bob")+".x.delivered", `{}`)
	ingest.mayNotPublish(queue.MetaSubject, ``)
	for _, subj := range []string{"_INBOX.>", queue.InboxPrefix(queue.RoleDispatcher) + ".>", queue.InboxPrefix(queue.RoleOps) + ".>", "dispatch.ctl.lanes", "dispatch.ctl.queued", ">"} {
		ingest.mayNotSubscribe(subj)
	}

	dispatcher := connectAs(t, srv, "dispatcher", "pw-dispatcher", queue.InboxPrefix(queue.RoleDispatcher))
	for _, subj := range []string{"$JS.API.STREAM.DELETE." + queue.RequestStream, "$JS.API.STREAM.PURGE." + queue.RequestStream,
		"$JS.API.STREAM.DELETE." + queue.DeadLetterStream, "$JS.API.STREAM.DELETE.KV_" + queue.LeaseBucket} {
		dispatcher.mayNotPublish(subj, `{}`)
	}
	for _, subj := range []string{"_INBOX.>", queue.InboxPrefix(queue.RoleIngest) + ".>", queue.InboxPrefix(queue.RoleOps) + ".>"} {
		dispatcher.mayNotSubscribe(subj)
	}

	ops := connectAs(t, srv, "ops", "pw-ops", queue.InboxPrefix(queue.RoleOps))
	ops.mayNotPublish("$KV."+queue.LeaseBucket+".p.1", `x`)
	ops.mayNotPublish(request.DeadLetterPrefix+request.EncodeClientID("bob"), `x`)
	ops.mayNotPublish(request.EventPrefix+request.EncodeClientID("bob")+".x.delivered", `{}`)
	ops.mayNotPublish("$JS.API.STREAM.MSG.DELETE."+queue.RequestStream, `{"seq":1}`)
	for _, subj := range []string{"$JS.API.STREAM.DELETE." + queue.RequestStream, "$JS.API.STREAM.PURGE." + queue.RequestStream,
		"$JS.API.STREAM.UPDATE." + queue.RequestStream, "$JS.API.STREAM.CREATE.X", "$JS.API.STREAM.DELETE.KV_" + queue.ControlBucket} {
		ops.mayNotPublish(subj, `{}`)
	}
	for _, subj := range []string{"_INBOX.>", queue.InboxPrefix(queue.RoleDispatcher) + ".>", queue.InboxPrefix(queue.RoleIngest) + ".>", "dispatch.ctl.lanes", "dispatch.ctl.queued"} {
		ops.mayNotSubscribe(subj)
	}
	ops.mayNotPublish("dispatch.ctl.queued", `{}`)

	follower.mayNotPublish("$JS.API.INFO", ``)
	follower.mayNotPublish(request.RequestPrefix+request.EncodeClientID("alice"), `{}`)
	for _, subj := range []string{request.EventPrefix + request.EncodeClientID("bob") + ".>", request.EventPrefix + ">", "_INBOX.>",
		queue.InboxPrefix(queue.RoleIngest) + ".>"} {
		follower.mayNotSubscribe(subj)
	}
	for _, u := range []*natsUser{ingest, dispatcher, ops, follower} {
		u.checks.Wait() // every refusal is in before the ledger is checked
	}
	s.check(0)
}

// The shipped users' permissions are the roles' (pkg/queue): the allow-lists in
// deployments/nats/nats.conf are what the code says each service needs, no more; its
// monitoring port listens on loopback only (it names every connection's user).
func TestShippedNATSPermissionsAreTheRoles(t *testing.T) {
	t.Parallel()
	raw, _ := os.ReadFile("../deployments/nats/nats.conf")
	path := filepath.Join(t.TempDir(), "nats.conf")
	conf := string(raw)
	for role, pw := range rolePasswords {
		conf = strings.ReplaceAll(conf, "$"+role+"_NATS_PASSWORD", fmt.Sprintf("%q", pw))
	}
	conf = strings.ReplaceAll(conf, "$NATS_SERVER_NAME", "x")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if opts.HTTPHost != "127.0.0.1" {
		t.Errorf("nats.conf's monitoring listens on %q: it lists connections and users without authentication, keep it on loopback", opts.HTTPHost)
	}
	seen := map[string]bool{}
	for _, u := range opts.Users {
		if u.Account == nil || u.Account.Name != "DISPATCH" {
			continue
		}
		seen[u.Username] = true
		want := queue.RolePermissions(queue.Role(u.Username))
		if err := samePermissions(u.Permissions, want); err != nil {
			t.Errorf("nats.conf's user %s: %v", u.Username, err)
		}
	}
	for _, r := range queue.Roles {
		if !seen[string(r)] {
			t.Errorf("nats.conf has no user %s", r)
		}
	}
}

// samePermissions says how got differs from want.
func samePermissions(got *server.Permissions, want queue.Permissions) error {
	if got == nil || got.Publish == nil || got.Subscribe == nil {
		return errors.New("no publish or subscribe allow-list")
	}
	var errs []error
	for _, c := range []struct {
		what      string
		got, want []string
		deny      []string
	}{{"publish", got.Publish.Allow, want.Publish, got.Publish.Deny}, {"subscribe", got.Subscribe.Allow, want.Subscribe, got.Subscribe.Deny}} {
		g, w := slices.Sorted(slices.Values(c.got)), slices.Sorted(slices.Values(c.want))
		if !slices.Equal(g, w) {
			errs = append(errs, fmt.Errorf("%s allows %q, the role needs %q", c.what, g, w))
		}
		if len(c.deny) > 0 {
			errs = append(errs, fmt.Errorf("%s has a deny-list %q: roles are allow-lists", c.what, c.deny))
		}
	}
	if (got.Response != nil) != want.Responses {
		errs = append(errs, fmt.Errorf("allow_responses is %v, the role needs %v", got.Response != nil, want.Responses))
	}
	return errors.Join(errs...)
}

// The standalone's NATS_LISTEN with passwords takes the roles' users and no one else
// (issue 35, findings 1 and 8): an ingest elsewhere connects as ingest and its requests
// reach raven through the standalone's dispatcher (which connects in process as a
// dispatcher user of its own); dispatchctl works as ops; ingest may not read a queued
// body; a connection without a user, or with ingest's user and a wrong password, is
// refused.
func TestStandaloneListenTakesTheRoleUsers(t *testing.T) {
	t.Parallel()
	const interval = 300 * time.Millisecond
	s := newStack(t, options{interval: interval, noStart: true})
	natsAddr, standaloneIngest, ingestAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	p := startProc(t, map[string]string{"DATA_DIR": t.TempDir(), "INGEST_ADDR": standaloneIngest, "NATS_LISTEN": natsAddr,
		"INGEST_NATS_PASSWORD": "pw-ingest", "OPS_NATS_PASSWORD": "pw-ops", "RAVEN_URL": s.ravenURL, "DISPATCH_INTERVAL": interval.String()}, "-standalone")
	waitReady(t, "http://"+standaloneIngest)
	startBin(t, ingestBin, map[string]string{"NATS_URL": "nats://ingest:pw-ingest@" + natsAddr, "INGEST_ADDR": ingestAddr})
	waitReady(t, "http://"+ingestAddr)
	s.ingestURL = "http://" + ingestAddr + "/v1/requests"
	for n := range 3 {
		s.post("alice", n)
		s.post("bob", n)
	}
	itest.WaitForState(t, time.Minute, "six deliveries", func() (bool, string) {
		return s.ledger.Delivered() >= 6, fmt.Sprintf("%d delivered", s.ledger.Delivered())
	})
	cmd := exec.Command(ctlBin, "clients")
	cmd.Env = []string{"NATS_URL=nats://ops:pw-ops@" + natsAddr, "PATH=" + os.Getenv("PATH")}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("dispatchctl as ops: %v\n%s", err, out)
	}
	for _, url := range []string{"nats://" + natsAddr, "nats://ingest:wrong@" + natsAddr} {
		if nc, err := nats.Connect(url, nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Errorf("%s got in", url)
		}
	}
	nc, err := nats.Connect("nats://"+natsAddr, nats.Timeout(queuetest.DialTimeout), nats.UserInfo("ingest", "pw-ingest"), nats.CustomInboxPrefix(queue.InboxPrefix(queue.RoleIngest)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if msg, err := nc.Request("$JS.API.STREAM.MSG.GET."+queue.RequestStream, []byte(`{"seq":1}`), 2*time.Second); err == nil {
		t.Errorf("ingest read a stored request: %s", msg.Data)
	}
	s.check(0)
	if strings.Contains(p.Output(), "without authentication") {
		t.Errorf("the standalone warned of no authentication with users set:\n%s", p.Output())
	}
}
