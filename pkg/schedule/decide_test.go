package schedule_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// An attempt's meaning is read from the send's error by the shared words alone
// (request's error types), wrapped or not, as raven's client returns them.
func TestDecideReadsTheSharedWords(t *testing.T) {
	t.Parallel()
	p := schedule.Policy{MaxAttempts: 3, MaxAge: time.Hour}
	t0 := time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name    string
		err     error
		attempt int
		end     time.Time
		want    schedule.Decision
	}{
		{"delivered", nil, 1, t0, schedule.Decision{Outcome: schedule.OutcomeDelivered, Kind: schedule.Delivered}},
		{"503 with Retry-After", fmt.Errorf("sending: %w", &request.TransientError{Status: http.StatusServiceUnavailable, After: 3 * time.Second}), 1, t0,
			schedule.Decision{Outcome: schedule.OutcomeTransient, Kind: schedule.Retry, RetryAfter: 3 * time.Second, Refused: true, PauseAll: 3 * time.Second}},
		{"429", fmt.Errorf("sending: %w", &request.TransientError{Status: http.StatusTooManyRequests}), 1, t0,
			schedule.Decision{Outcome: schedule.OutcomeTransient, Kind: schedule.Retry, Refused: true}},
		{"500", &request.TransientError{Status: 500}, 1, t0, schedule.Decision{Outcome: schedule.OutcomeTransient, Kind: schedule.Retry}},
		{"no answer in time", fmt.Errorf("sending: %w", request.ErrNoAnswerInTime), 1, t0,
			schedule.Decision{Outcome: schedule.OutcomeTransient, Kind: schedule.Retry, Refused: true}},
		{"422", fmt.Errorf("sending: %w", &request.PermanentError{Status: 422}), 1, t0,
			schedule.Decision{Outcome: schedule.OutcomePermanent, Kind: schedule.DeadLettered, Reason: request.ReasonPermanent}},
		{"out of attempts", &request.TransientError{Status: 500}, 3, t0,
			schedule.Decision{Outcome: schedule.OutcomeTransient, Kind: schedule.DeadLettered, Reason: request.ReasonAttemptsExhausted}},
		{"out of age, overloaded", &request.TransientError{Status: http.StatusTooManyRequests}, 1, t0.Add(2 * time.Hour),
			schedule.Decision{Outcome: schedule.OutcomeTransient, Kind: schedule.DeadLettered, Reason: request.ReasonAgeExhausted, Refused: true}},
	} {
		if got := p.Decide(c.err, c.attempt, t0, c.end); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}
