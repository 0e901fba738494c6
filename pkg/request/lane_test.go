package request_test

import (
	"strings"
	"testing"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// A lane is the queue's subject and back, for any clientId; a subject of no one client's
// lane is refused.
func TestLaneIsItsSubjectAndBack(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		p      int
		client string
	}{{0, "alice"}, {63, "a.b c*>"}, {7, "ünïcødé"}, {1023, "x"}} {
		lane := request.LaneOfClient(c.p, c.client)
		back, err := request.LaneOf(lane.Subject())
		if err != nil || back != lane {
			t.Fatalf("%+v: subject %s reads back as %+v, %v", lane, lane.Subject(), back, err)
		}
		if id, err := back.ClientID(); err != nil || id != c.client {
			t.Fatalf("%+v: clientId %q, %v; want %q", back, id, err, c.client)
		}
		if lane.String() != lane.Subject() {
			t.Fatalf("%+v prints as %s, want its subject", lane, lane.String())
		}
	}
	for _, s := range []string{"", "dispatch.req.", "dispatch.req.3", "dispatch.req.3.", "dispatch.req.x.abc",
		"dispatch.req.3.a.b", "dispatch.req.-1.abc", "dispatch.req.03.abc", "dispatch.req.+3.abc", "dispatch.dead.abc", "dispatch.req.abc"} {
		if lane, err := request.LaneOf(s); err == nil {
			t.Errorf("subject %q read as lane %+v, want an error", s, lane)
		}
	}
}

func TestParseReasonTakesTheSnakeCaseSpellingAndNoOther(t *testing.T) {
	for in, want := range map[string]request.Reason{
		"attempts_exhausted": request.ReasonAttemptsExhausted, "age_exhausted": request.ReasonAgeExhausted,
		"permanent": request.ReasonPermanent, "expired": request.ReasonExpired,
	} {
		if got, err := request.ParseReason(in); err != nil || got != want {
			t.Errorf("ParseReason(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "tired", "Permanent", "attempts exhausted", "attempts-exhausted", "attempts_exhausted "} {
		if _, err := request.ParseReason(in); err == nil || !strings.Contains(err.Error(), "attempts_exhausted") {
			t.Errorf("ParseReason(%q): %v, want an error that lists the reasons", in, err)
		}
	}
}
