package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/admin"
	"github.com/penguinhq/dispatcher/pkg/introspect"
)

// A dispatcher that cannot answer (its answer over the NATS server's max_payload, say)
// says why, and the clients page and the overview name it: its lanes are missing from
// the page, where they were missing without a word.
func TestADispatcherThatCannotAnswerIsNamed(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.publish(t, "c1", "r1")
	stop, err := f.q.ServeQuestions("d1", func(context.Context, string, []byte) ([]byte, error) {
		return nil, errors.New("its answer of 2000000 bytes is over the NATS server's max_payload of 1048576 bytes")
	}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	const want = "dispatcher d1's answer: its answer of 2000000 bytes is over the NATS server's max_payload of 1048576 bytes"
	// The fixture's lane wait is short: on a busy machine the word may come after a page
	// was answered, and is shown on the next.
	var page admin.ClientsPage
	for deadline := time.Now().Add(10 * time.Second); ; {
		rec := f.call(t, http.MethodGet, "/admin/v1/clients?sort=next", token, "", &page)
		if rec.Code != http.StatusOK {
			t.Fatalf("clients: %d %s", rec.Code, rec.Body)
		}
		if len(page.Problems) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(page.Problems) != 1 || page.Problems[0] != want || len(page.Clients) != 1 {
		t.Fatalf("clients page: %d clients, problems %q; want c1, and d1 named: %q", len(page.Clients), page.Problems, want)
	}
	if o := f.svc.Overview(context.Background()); !strings.Contains(strings.Join(o.Problems, "\n"), want) {
		t.Fatalf("overview problems %q; want d1 named", o.Problems)
	}
	// d1 answers again: it is no longer named, though its word is not 30 s old.
	stop()
	stopAgain, err := f.q.ServeQuestions("d1", func(context.Context, string, []byte) ([]byte, error) {
		return json.Marshal(introspect.LanesAnswer{Instance: "d1"})
	}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer stopAgain()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		page = admin.ClientsPage{} // an answer without problems leaves the field as it was
		f.call(t, http.MethodGet, "/admin/v1/clients?sort=next", token, "", &page)
		if len(page.Problems) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("d1 answers again, and the clients page still names it: %q", page.Problems)
		}
	}
}
