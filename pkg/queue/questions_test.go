package queue_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// A question reaches every dispatcher with its name and body as asked; a message without
// the name (an admin of the version before the questions) reaches them with none; and each
// answer comes back to the asker as it was written.
func TestQuestionsCarryTheirNameAndBody(t *testing.T) {
	t.Parallel()
	nc, q := openOnServer(t)
	ctx := context.Background()
	type asked struct{ name, body string }
	heard := make(chan asked, 4)
	for _, id := range []string{"d1", "d2"} {
		stop, err := q.ServeQuestions(func(_ context.Context, name string, body []byte) ([]byte, error) {
			heard <- asked{name, string(body)}
			if name == "refused" {
				return nil, errors.New("no answer")
			}
			return []byte(`{"instance":"` + id + `"}`), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
	}
	answers, err := q.Ask(ctx, "due", []byte(`{"limit":3}`), 5*time.Second, 2)
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
	if _, err := nc.Request("dispatch.ctl.lanes", []byte(`{"by_due":true}`), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if a := <-heard; a != (asked{"", `{"by_due":true}`}) {
		t.Errorf("an earlier admin's query was heard as %+v", a)
	}
	<-heard
	answers, _ = q.Ask(ctx, "refused", nil, 200*time.Millisecond, 0)
	if len(answers) != 0 {
		t.Errorf("a question no dispatcher answers got %q", answers)
	}
}
