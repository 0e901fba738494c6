package introspect_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/penguinhq/dispatcher/pkg/introspect"
	"github.com/penguinhq/dispatcher/pkg/request"
	"github.com/penguinhq/dispatcher/pkg/schedule"
)

// fullLanes answers with as many lanes as may be asked for, each as long as a lane's
// description can be: the longest clientId, every time set with nanoseconds.
type fullLanes struct{ answerer }

func widestLanes(n int) []schedule.LaneInfo {
	stamp := time.Date(2026, 12, 6, 11, 0, 0, 123456789, time.UTC)
	out := make([]schedule.LaneInfo, n)
	for i := range out {
		client := strings.Repeat("\U0010FFFF", request.MaxClientIDBytes/4) // 4 bytes a rune: the longest token
		out[i] = schedule.LaneInfo{Subject: request.LaneOfClient(1023, client).Subject(), State: "backing_off", NextSend: stamp,
			Attempts: 1 << 30, LastEnd: stamp, Interval: 1<<63 - 1, LastDelivered: stamp}
	}
	return out
}

func (f *fullLanes) AnswerLanes(_ context.Context, q introspect.LanesQuestion) ([]schedule.LaneInfo, error) {
	return widestLanes(introspect.MaxLanes), nil
}

func (f *fullLanes) AnswerDueLanes(_ context.Context, q introspect.DueLanesQuestion) ([]schedule.LaneInfo, error) {
	return widestLanes(introspect.MaxDueLanes), nil
}

// An answer of the most lanes a question may ask for fits in one NATS message of the
// server's default size (1 MiB, less room for its headers): a larger one cannot be
// sent, and the admin would hear nothing from that dispatcher. (MaxDueLanes was 10,000:
// about 4,000 lanes of short clientIds filled a message.)
func TestTheLargestLanesAnswerFitsInAMessage(t *testing.T) {
	t.Parallel()
	const fits = 1<<20 - 8<<10
	for _, c := range []struct {
		name, question string
		body           []byte
	}{
		{"due lanes", introspect.NameDueLanes, introspect.Body(introspect.DueLanesQuestion{Limit: introspect.MaxDueLanes})},
		{"lanes", introspect.NameLanes, introspect.Body(introspect.LanesQuestion{Limit: introspect.MaxLanes})},
	} {
		out, err := introspect.Answer(context.Background(), &fullLanes{}, c.question, c.body)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		t.Logf("%s: %d bytes", c.name, len(out))
		if len(out) > fits {
			t.Errorf("the widest answer to %s is %d bytes: over the %d a message of NATS's default size holds", c.name, len(out), fits)
		}
	}
}
