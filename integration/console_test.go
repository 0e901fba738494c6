package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The console served by either of two dispatcher processes shows both instances' lanes
// and minutes, as dispatchctl clients does: each client's row names the instance that
// owns its partition.
func TestConsoleShowsEveryInstancesLanes(t *testing.T) {
	t.Parallel()
	// A 10 s interval: the backlog lasts half a minute after every client's first
	// delivery, for the pages to be read while there is one; then it is lowered.
	const interval, clients, each = 10 * time.Second, 16, 4
	s := newStack(t, options{interval: interval, noStart: true})
	leases, err := s.q.Leases(context.Background(), 6*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	const token = "console-token-0123456789abcdef0123"
	opsA, opsB := freeAddr(t), freeAddr(t)
	env := map[string]string{"NATS_URL": s.srv.ClientURL(), "RAVEN_URL": s.ravenURL, "DISPATCH_INTERVAL": interval.String(),
		"LEASE_TTL": "6s", "RAVEN_TIMEOUT": "3s", "ADMIN_TOKEN": token, "EVENTS": "false",
		// Both instances are known by their heartbeats: the wait ends when both answered,
		// and a loaded machine has seconds to answer in.
		"LANE_WAIT": "5s"}
	startProc(t, with(env, "INSTANCE_ID", "a", "OPS_ADDR", opsA))
	startProc(t, with(env, "INSTANCE_ID", "b", "OPS_ADDR", opsB))
	waitFor(t, 2*time.Minute, "a and b to hold 32 partitions each", func() bool {
		owners, err := leases.Owners(context.Background())
		if err != nil {
			return false
		}
		n := map[string]int{}
		for _, id := range owners {
			n[id]++
		}
		return n["a"] == 32 && n["b"] == 32
	})
	for n := range each {
		for i := range clients {
			s.post(clientName(i), n)
		}
	}
	waitFor(t, time.Minute, "a first delivery of every client", func() bool { return s.ledger.Delivered() >= clients })

	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, Timeout: 10 * time.Second}
	get := func(base, path string) string {
		res, err := browser.Get("http://" + base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("GET %s%s: %d %s", base, path, res.StatusCode, b)
		}
		return string(b)
	}
	// Signed in on a; the cookie is good on b too, which has the same ADMIN_TOKEN.
	if res, err := browser.PostForm("http://"+opsA+"/console/signin", url.Values{"token": {token}}); err != nil {
		t.Fatal(err)
	} else {
		res.Body.Close()
	}
	bCookie, _ := url.Parse("http://" + opsB + "/console/")
	aCookie, _ := url.Parse("http://" + opsA + "/console/")
	jar.SetCookies(bCookie, jar.Cookies(aCookie))

	owner := regexp.MustCompile(`<tr data-client="(client-\d+)">(?s:.*?)<td>(a|b|)</td>\s*</tr>`)
	// Read again until every row has its owner: an instance that answers after the lane
	// wait is left out of that page, by design.
	var page string
	waitForState(t, 2*time.Minute, "b's clients page with every client and its owner, a and b both", func() (bool, string) {
		page = get(opsB, "/console/clients?sort=next")
		rows := owner.FindAllStringSubmatch(page, -1)
		byOwner := map[string]int{}
		for _, r := range rows {
			byOwner[r[2]]++
		}
		return len(rows) == clients && byOwner["a"] > 0 && byOwner["b"] > 0 && byOwner[""] == 0,
			fmt.Sprintf("%d rows, owners %v", len(rows), byOwner)
	})
	mustContain(t, page, `class="lane lane-waiting"`)

	waitForState(t, time.Minute, "a's overview with a row for each instance's last minute", func() (bool, string) {
		overview := get(opsA, "/console/")
		var missing []string
		for _, id := range []string{"a", "b"} {
			if !regexp.MustCompile(`<tr><td>` + id + `</td><td class="num">\d+</td>`).MatchString(overview) {
				missing = append(missing, id)
			}
		}
		return len(missing) == 0 && !strings.Contains(overview, "No dispatcher answered"), fmt.Sprintf("no row for %v", missing)
	})
	ctl, err := s.q.Control(context.Background(), testLog())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.SetGlobalInterval(context.Background(), 200*time.Millisecond, "test"); err != nil {
		t.Fatal(err)
	}
	s.opts.interval = 200 * time.Millisecond // the ledger judges by the interval in force last
	s.waitDone(time.Minute)
	s.check(0)
}
