package retry

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestDoStopsOnSuccess(t *testing.T) {
	var waits []time.Duration
	p := Policy{First: time.Millisecond, Max: 4 * time.Millisecond,
		OnFail: func(_ int, _ error, w time.Duration) { waits = append(waits, w) }}
	n := 0
	tries, err := Do(context.Background(), p, func(context.Context) error {
		if n++; n < 5 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil || tries != 5 {
		t.Fatalf("tries %d, err %v: want 5, nil", tries, err)
	}
	want := []time.Duration{1, 2, 4, 4}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if len(waits) != len(want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("waits %v, want %v (doubling up to Max)", waits, want)
		}
	}
}

func TestDoGivesUp(t *testing.T) {
	boom := errors.New("boom")
	tries, err := Do(context.Background(), Policy{First: time.Microsecond, Tries: 3}, func(context.Context) error { return boom })
	if tries != 3 || !errors.Is(err, boom) {
		t.Fatalf("tries %d, err %v: want 3 tries and the last error", tries, err)
	}
	tries, err = Do(context.Background(), Policy{First: time.Microsecond}, func(context.Context) error { return Final(boom) })
	if tries != 1 || err != boom {
		t.Fatalf("tries %d, err %v: want 1 try and the unmarked error", tries, err)
	}
}

func TestDoEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	tries, err := Do(ctx, Policy{First: time.Hour}, func(context.Context) error {
		cancel()
		return errors.New("unreachable")
	})
	if tries != 1 || !errors.Is(err, context.Canceled) {
		t.Fatalf("tries %d, err %v: want 1 try and context.Canceled", tries, err)
	}
}
