package queue_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/queue/queuetest"
)

// A question reaches every dispatcher with its name and body as asked, and each answer
// comes back to the asker as it was written.
func TestQuestionsCarryTheirNameAndBody(t *testing.T) {
	t.Parallel()
	_, q := openOnServer(t)
	ctx := context.Background()
	type asked struct{ name, body string }
	heard := make(chan asked, 4)
	for _, id := range []string{"d1", "d2"} {
		stop, err := q.ServeQuestions(id, func(_ context.Context, name string, body []byte) ([]byte, error) {
			heard <- asked{name, string(body)}
			if name == "refused" {
				return nil, errors.New("no answer")
			}
			return []byte(`{"instance":"` + id + `"}`), nil
		}, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
	}
	answers, _, err := q.Ask(ctx, "due", []byte(`{"limit":3}`), 5*time.Second, 2)
	if err != nil || len(answers) != 2 {
		t.Fatalf("asked two dispatchers, got %d answers: %v", len(answers), err)
	}
	got := []string{string(answers[0]), string(answers[1])}
	slices.Sort(got)
	if got[0] != `{"instance":"d1"}` || got[1] != `{"instance":"d2"}` {
		t.Errorf("answers %q", got)
	}
	for range 2 {
		if a := <-heard; a != (asked{"due", `{"limit":3}`}) {
			t.Errorf("a dispatcher heard %+v", a)
		}
	}
	answers, unanswered, _ := q.Ask(ctx, "refused", nil, 5*time.Second, 2)
	slices.SortFunc(unanswered, func(a, b queue.Unanswered) int { return strings.Compare(a.Instance, b.Instance) })
	if len(answers) != 0 || !slices.Equal(unanswered, []queue.Unanswered{{"d1", "no answer"}, {"d2", "no answer"}}) {
		t.Errorf("a question the dispatchers fail got answers %q, and their word %+v; want none, and each one's reason", answers, unanswered)
	}
}

// An answer larger than the NATS server carries is not dropped unsent, leaving the asker
// to wait out its wait and show that dispatcher's part as empty: the dispatcher says why.
func TestAnAnswerOverTheMaxPayloadIsToldAsSuch(t *testing.T) {
	t.Parallel()
	srv := queuetest.ServerWith(t, t.TempDir(), "127.0.0.1:0", func(o *server.Options) { o.MaxPayload = 64 << 10 })
	q, err := queue.Open(context.Background(), queuetest.Conn(t, srv), queue.Config{}, queue.CreateOrUpdate)
	if err != nil {
		t.Fatal(err)
	}
	big := []byte(`"` + strings.Repeat("x", 100<<10) + `"`)
	stop, err := q.ServeQuestions("d1", func(context.Context, string, []byte) ([]byte, error) { return big, nil }, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	const wait = 10 * time.Second
	asked := time.Now()
	answers, unanswered, err := q.Ask(context.Background(), "due", nil, wait, 1)
	if err != nil || len(answers) != 0 || len(unanswered) != 1 {
		t.Fatalf("an answer over the max payload: %d answers, word %+v, %v; want the dispatcher's word alone", len(answers), unanswered, err)
	}
	if u := unanswered[0]; u.Instance != "d1" || !strings.Contains(u.Reason, "max_payload of 65536 bytes") || !strings.Contains(u.Reason, "102402 bytes") {
		t.Errorf("the word of %q: %q; want it to name the answer's size and the server's max_payload", u.Instance, u.Reason)
	}
	if took := time.Since(asked); took >= wait {
		t.Errorf("the asker waited %s, its whole wait: the word should end it", took)
	}
}

// A dispatcher that cannot answer within the asker's wait (its loop busy, say) says so
// while the asker still listens, not after: it takes half the wait (AnswerTime), not its
// own second, when the wait is shorter than two. Here the wait is long enough for a
// loaded machine (the word comes after the dispatcher's second), and the asker's wait
// ends with the word, not at its end.
func TestASlowAnswerIsToldWithinTheAskersWait(t *testing.T) {
	t.Parallel()
	for within, want := range map[string]time.Duration{"900ms": 450 * time.Millisecond, "10s": time.Second, "": time.Second, "-1s": time.Second} {
		if got := queue.AnswerTime(within); got != want {
			t.Errorf("an asker waiting %q: the dispatcher takes %s, want %s", within, got, want)
		}
	}
	_, q := openOnServer(t)
	given := make(chan time.Duration, 2) // the time the dispatcher was given, as it began
	stop, err := q.ServeQuestions("d1", func(ctx context.Context, _ string, _ []byte) ([]byte, error) {
		deadline, _ := ctx.Deadline()
		given <- time.Until(deadline)
		<-ctx.Done()
		return nil, fmt.Errorf("dispatcher did not answer: %w", ctx.Err())
	}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	// The asker's wait reaches the dispatcher (its header): asked to answer within 1.5 s,
	// it is given at most 0.75 s (its own second otherwise). Whether the word then
	// arrives in time is the machine's; what it was given is not.
	_, _, _ = q.Ask(context.Background(), "due", nil, 1500*time.Millisecond, 1)
	if d := <-given; d > 750*time.Millisecond {
		t.Errorf("asked within 1.5s, the dispatcher was given %s; want at most half the wait", d)
	}
	const wait = 30 * time.Second
	asked := time.Now()
	answers, unanswered, err := q.Ask(context.Background(), "due", nil, wait, 1)
	if err != nil || len(answers) != 0 || len(unanswered) != 1 || !strings.Contains(unanswered[0].Reason, "deadline exceeded") {
		t.Fatalf("a dispatcher slower than the asker's wait: %d answers, word %+v, %v; want its word that it did not answer", len(answers), unanswered, err)
	}
	if took := time.Since(asked); took >= wait {
		t.Errorf("the asker waited %s, its whole wait: the word should end it", took)
	}
}
