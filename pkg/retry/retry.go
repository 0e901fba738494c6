// Package retry runs an operation again, with growing waits, until it succeeds, fails for
// good, runs out of tries, or its context ends. It is the one retry loop of the service:
// the dispatcher's queue writes, a replay's removals and the binaries' start-up use it.
package retry

import (
	"context"
	"errors"
	"time"
)

// Policy says how long to wait between tries and when to give up.
type Policy struct {
	// First is the wait after the first failure.
	First time.Duration
	// Max is the longest wait: each wait doubles up to it. Zero keeps every wait at First.
	Max time.Duration
	// Tries is the most tries; zero tries until op succeeds, fails for good or ctx ends.
	Tries int
	// OnFail, if not nil, hears of every failure that will be tried again: which try
	// failed, why, and the wait before the next.
	OnFail func(try int, err error, wait time.Duration)
}

type final struct{ err error }

func (f final) Error() string { return f.err.Error() }
func (f final) Unwrap() error { return f.err }

// Final marks err as not worth trying again: Do returns it at once.
func Final(err error) error {
	if err == nil {
		return nil
	}
	return final{err}
}

// Do calls op until it returns nil, returns an error marked Final, or the tries run out,
// and returns the last error (without its Final mark). If ctx ends during a wait, Do
// returns ctx.Err(). tries is how many calls were made.
func Do(ctx context.Context, p Policy, op func(ctx context.Context) error) (tries int, err error) {
	wait := p.First
	for tries = 1; ; tries++ {
		err = op(ctx)
		var f final
		switch {
		case err == nil:
			return tries, nil
		case errors.As(err, &f):
			return tries, f.err
		case p.Tries > 0 && tries >= p.Tries:
			return tries, err
		}
		if p.OnFail != nil {
			p.OnFail(tries, err, wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return tries, ctx.Err()
		case <-t.C:
		}
		if p.Max > 0 {
			wait = min(wait*2, p.Max)
		}
	}
}
