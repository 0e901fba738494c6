package queue_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// The keys renamed to camelCase (ADR 14) during a rolling upgrade: a control record the
// previous version stored is read, and one stored now carries the old keys as well, so
// that a dispatcher not yet upgraded reads it as it was meant.
func TestControlRecordsReadAndWriteBothSpellings(t *testing.T) {
	t.Parallel()
	nc, q := openOnServer(t)
	ctx := context.Background()
	ctl, err := q.Control(ctx, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, queue.ControlBucket)
	if err != nil {
		t.Fatal(err)
	}
	// As the previous version wrote them.
	if _, err := kv.PutString(ctx, "client."+request.EncodeClientID("alice"),
		`{"interval":"7s","paused":true,"purge_through":42,"updated_at":"2026-12-01T10:00:00Z","by":"old"}`); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.PutString(ctx, "budget", `{"max_rate":120,"max_inflight":6,"updated_at":"2026-12-01T10:00:00Z","by":"old"}`); err != nil {
		t.Fatal(err)
	}
	st, err := ctl.Client(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if time.Duration(st.Interval) != 7*time.Second || !st.Paused || st.PurgeThrough != 42 || st.UpdatedAt.IsZero() || st.By != "old" {
		t.Fatalf("alice's old record read as %+v", st)
	}
	b, err := ctl.Budget(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b.MaxRate == nil || *b.MaxRate != 120 || b.MaxInFlight == nil || *b.MaxInFlight != 6 || b.UpdatedAt.IsZero() {
		t.Fatalf("the old budget record read as %+v", b)
	}
	cur, stop, err := ctl.WatchSteering(ctx, func(request.SteerChange) {})
	if err != nil {
		t.Fatal(err)
	}
	stop()
	heard := map[string]request.SteerChange{}
	for _, c := range cur {
		heard[c.Client] = c
	}
	if c := heard[request.EncodeClientID("alice")]; !c.Steering.Paused || c.Steering.PurgeThrough != 42 {
		t.Errorf("the watch began with alice as %+v", c)
	}
	if c := heard[""]; c.Budget == nil || c.Budget.MaxInFlight == nil || *c.Budget.MaxInFlight != 6 {
		t.Errorf("the watch began with the budget as %+v", c)
	}

	// As this version writes them: both spellings.
	if _, err := ctl.UpdateClient(ctx, "alice", "new", func(s *request.Steering) { s.PurgeThrough = 43 }); err != nil {
		t.Fatal(err)
	}
	rate := 99.0
	if _, err := ctl.UpdateBudget(ctx, "new", func(b *request.Budget) { b.MaxRate = &rate }); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string][]string{
		"client." + request.EncodeClientID("alice"): {`"purgeThrough":43`, `"purge_through":43`, `"updatedAt":`, `"updated_at":`},
		"budget": {`"maxRate":99`, `"max_rate":99`, `"maxInFlight":6`, `"max_inflight":6`},
	} {
		e, err := kv.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range want {
			if !strings.Contains(string(e.Value()), w) {
				t.Errorf("%s stored as %s: no %s", key, e.Value(), w)
			}
		}
	}
}
