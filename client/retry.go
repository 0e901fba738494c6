package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

const (
	// DefaultRetryBase is RetryPolicy.Base when it is zero.
	DefaultRetryBase = 100 * time.Millisecond
	// DefaultRetryMax is RetryPolicy.Max when it is zero.
	DefaultRetryMax = 30 * time.Second
)

// RetryPolicy says how long a call waits between tries and when it gives up. Before
// retry number n (0 for the first retry) a call waits uniform[0, min(Max, Base·2^n)]
// when ingest asked for no wait, and RetryAfter + uniform[0, min(RetryAfter, Base·2^n)]
// when it asked for RetryAfter.
type RetryPolicy struct {
	// Base is the cap of the random wait before the first retry; the cap doubles with
	// every retry. Defaults to DefaultRetryBase.
	Base time.Duration
	// Max is the most the cap grows to. Defaults to DefaultRetryMax.
	Max time.Duration
	// MaxAttempts is the most times one request is sent, the first time included, so 1
	// turns retries off. For SubmitBatch it is the most times each item is sent; for
	// Wait it applies to each long poll, not to the polls together. Defaults to 0:
	// retry until the context ends.
	MaxAttempts int
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.Base == 0 {
		p.Base = DefaultRetryBase
	}
	if p.Max == 0 {
		p.Max = DefaultRetryMax
	}
	return p
}

func (p RetryPolicy) validate() error {
	switch {
	case p.Base < 0:
		return fmt.Errorf("RetryPolicy.Base is %v; give a positive duration, or zero for %v", p.Base, DefaultRetryBase)
	case p.Max < p.Base:
		return fmt.Errorf("RetryPolicy.Max (%v) is below Base (%v); raise Max", p.Max, p.Base)
	case p.MaxAttempts < 0:
		return fmt.Errorf("RetryPolicy.MaxAttempts is %d; give 1 or more, or zero to retry until the context ends", p.MaxAttempts)
	}
	return nil
}

// delay is the wait before retry number n (0 for the first) when ingest asked for
// retryAfter: retryAfter plus full jitter, uniform in [0, min(Max, Base·2^n)], the jitter
// at most retryAfter again when ingest asked for a wait: it said when to come back, and
// the jitter only spreads the callers it turned away together.
func (p RetryPolicy) delay(n int, retryAfter time.Duration) time.Duration {
	ceiling := p.Base
	for range n {
		if ceiling >= p.Max/2 {
			ceiling = p.Max
			break
		}
		ceiling *= 2
	}
	ceiling = min(ceiling, p.Max)
	if retryAfter > 0 {
		ceiling = min(ceiling, retryAfter)
		return retryAfter + rand.N(ceiling)
	}
	return rand.N(ceiling)
}

// errAttemptsExhausted is backOff's reason to stop when MaxAttempts ran out.
var errAttemptsExhausted = errors.New("attempts exhausted")

// retrier counts the tries of one logical call.
type retrier struct {
	policy   RetryPolicy
	attempts int
}

// backOff records a failed try that may be retried and waits before the next. It
// returns why no next try should be made: the context's error, or
// errAttemptsExhausted.
func (r *retrier) backOff(ctx context.Context, retryAfter time.Duration) error {
	r.attempts++
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.policy.MaxAttempts > 0 && r.attempts >= r.policy.MaxAttempts {
		return errAttemptsExhausted
	}
	return sleep(ctx, r.policy.delay(r.attempts-1, retryAfter))
}

// stopped is the error of a call that stopped retrying for reason (from backOff)
// after last failed (last may be nil when every try was cut short by the context).
func (r *retrier) stopped(op string, reason, last error) error {
	e := &stoppedError{op: op, attempts: r.attempts, last: last}
	if reason != errAttemptsExhausted {
		e.ctxErr = reason
	}
	return e
}

// sleep waits d or until ctx ends, and then returns ctx's error.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// stoppedError is a call that stopped retrying: its context ended (ctxErr) or its
// attempts ran out (ctxErr nil). It wraps both the context's error and the last
// failure, so errors.Is and errors.As find either.
type stoppedError struct {
	op       string
	attempts int
	ctxErr   error
	last     error
}

func (e *stoppedError) Error() string {
	tries := "attempts"
	if e.attempts == 1 {
		tries = "attempt"
	}
	switch {
	case e.ctxErr == nil:
		return fmt.Sprintf("%s: giving up after %d %s: %v", e.op, e.attempts, tries, e.last)
	case e.last == nil:
		return fmt.Sprintf("%s: %v after %d %s", e.op, e.ctxErr, e.attempts, tries)
	default:
		return fmt.Sprintf("%s: %v after %d %s; last error: %v", e.op, e.ctxErr, e.attempts, tries, e.last)
	}
}

func (e *stoppedError) Unwrap() []error {
	var errs []error
	for _, err := range []error{e.ctxErr, e.last} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}
