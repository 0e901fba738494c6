package admin

import (
	"time"

	"github.com/penguinhq/dispatcher/pkg/queue"
	"github.com/penguinhq/dispatcher/pkg/request"
)

// ParseInterval reads an interval an operator gives: a duration from MinInterval to
// request.MaxInterval ("10s"), or "default" (also "0" or "0s") for the one it replaces: DISPATCH_INTERVAL for
// the global interval, the global interval for a client's. The admin API and dispatchctl
// both read intervals with it.
func ParseInterval(s string) (time.Duration, error) {
	if s == "default" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || (d != 0 && d < MinInterval) {
		return 0, invalid("interval %q: a duration of at least %s such as 10s, or default (also 0s) for the one it replaces", s, MinInterval)
	}
	if d > request.MaxInterval {
		return 0, invalid("interval %q: at most %s (a week)", s, request.MaxInterval)
	}
	return d, nil
}

// FilterOf builds a dead-letter filter from text: since and until are RFC 3339 times
// or durations back from now ("2h").
func FilterOf(id, client, reason, since, until string, now time.Time) (queue.DeadFilter, error) {
	f := queue.DeadFilter{ID: id, ClientID: client}
	var err error
	if reason != "" {
		if f.Reason, err = request.ParseReason(reason); err != nil {
			return f, invalid("%s", err)
		}
	}
	if f.Since, err = timeOf("since", since, now); err != nil {
		return f, err
	}
	if f.Until, err = timeOf("until", until, now); err != nil {
		return f, err
	}
	return f, nil
}

func timeOf(name, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := request.ParseTime(s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, invalid("%s %q: an RFC 3339 time (2026-11-30T03:00:00Z) or a duration back from now (2h)", name, s)
}
