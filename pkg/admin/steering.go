package admin

import (
	"context"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// MinInterval is the shortest interval an operator may set.
const MinInterval = time.Millisecond

// Steered is the steering in force: the global interval an operator set ("default" when
// none: each dispatcher uses its configured DISPATCH_INTERVAL), that configured interval
// where the answer comes from a dispatcher, and every client with a record.
type Steered struct {
	GlobalInterval string                      `json:"globalInterval"`
	Configured     string                      `json:"configuredInterval,omitempty"`
	Global         *request.Steering           `json:"global,omitempty"`
	Clients        map[string]request.Steering `json:"clients"`
}

// Steering reads the steering in force.
func (s *Service) Steering(ctx context.Context) (Steered, error) {
	g, err := s.ctl.Global(ctx)
	if err != nil {
		return Steered{}, err
	}
	cs, err := s.ctl.Clients(ctx)
	if err != nil {
		return Steered{}, err
	}
	out := Steered{Clients: cs, GlobalInterval: "default"}
	if s.interval > 0 {
		out.Configured = s.interval.String()
	}
	if g.By != "" || !g.IsZero() {
		out.Global = &g
	}
	if g.Interval > 0 {
		out.GlobalInterval = time.Duration(g.Interval).String()
	}
	return out, nil
}

// checkInterval refuses an interval an operator may not set: shorter than MinInterval, or
// longer than request.MaxInterval; zero goes back to replaced (the interval it replaces).
func checkInterval(d time.Duration, replaced string) error {
	if d != 0 && (d < MinInterval || d > request.MaxInterval) {
		return invalid("interval %s: must be from %s to %s, or 0 for %s", d, MinInterval, request.MaxInterval, replaced)
	}
	return nil
}

// SetInterval sets the global interval for every dispatcher; zero restores each one's
// configured DISPATCH_INTERVAL. changed is false when it was so already.
func (s *Service) SetInterval(ctx context.Context, d time.Duration, by string) (changed bool, err error) {
	if err := checkInterval(d, "the configured one"); err != nil {
		return false, err
	}
	if changed, err = s.ctl.SetGlobalInterval(ctx, d, by); err != nil || !changed {
		return changed, err
	}
	s.log.Info().Stringer("interval", d).Str("by", by).Msg("global interval set")
	return true, nil
}

// ClientSteering is what a change to one client's steering did.
type ClientSteering struct {
	ClientID string           `json:"clientId"`
	Steering request.Steering `json:"steering"`
	// Changed is false when the client was steered so already (paused twice, say):
	// nothing was written, and the dispatchers have nothing to apply.
	Changed bool `json:"changed"`
	// Queued is how many of the client's requests are queued now; nil when that could
	// not be read just after the change.
	Queued *uint64 `json:"queued,omitempty"`
}

// SetClientInterval gives one client its own interval; zero returns it to the global one.
func (s *Service) SetClientInterval(ctx context.Context, clientID string, d time.Duration, by string) (ClientSteering, error) {
	if err := checkInterval(d, "the global one"); err != nil {
		return ClientSteering{}, err
	}
	return s.steer(ctx, clientID, by, "client interval set", func(st *request.Steering) { st.Interval = request.Duration(d) })
}

// Pause stops sends to one client; its requests wait, and new ones are still accepted.
func (s *Service) Pause(ctx context.Context, clientID, by string) (ClientSteering, error) {
	return s.steer(ctx, clientID, by, "client paused", func(st *request.Steering) { st.Paused = true })
}

// Resume lets one client's requests go again, spaced as before.
func (s *Service) Resume(ctx context.Context, clientID, by string) (ClientSteering, error) {
	return s.steer(ctx, clientID, by, "client resumed", func(st *request.Steering) { st.Paused = false })
}

func (s *Service) steer(ctx context.Context, clientID, by, what string, change func(*request.Steering)) (ClientSteering, error) {
	res := ClientSteering{ClientID: clientID}
	if err := request.ValidateClientID(clientID); err != nil {
		return res, invalid("client: %s", err)
	}
	var was request.Steering
	st, err := s.ctl.UpdateClient(ctx, clientID, by, func(st *request.Steering) { was = *st; change(st) })
	if err != nil {
		return res, err
	}
	res.Steering = st
	res.Changed = !st.Same(was)
	if res.Changed {
		s.log.Info().Str("client_id", clientID).Str("by", by).Stringer("steering", st).Msg(what)
	}
	// The change is made: a count that cannot be read now does not undo it.
	if _, n, _, err := s.q.ClientLane(ctx, clientID); err == nil {
		res.Queued = &n
	}
	return res, nil
}

// PurgeResult says what a purge asked for.
type PurgeResult struct {
	ClientID string `json:"clientId"`
	// Through is the sequence up to which the client's requests are dead-lettered; 0
	// when it had nothing queued.
	Through uint64 `json:"through"`
	// Requests is how many were queued when the purge was asked for.
	Requests uint64 `json:"requests"`
	// Remaining is how many of those are still queued when Purge returns.
	Remaining uint64 `json:"remaining"`
}

// Purge moves one client's backlog, as it is now, to the dead-letter stream (reason
// "purged"), unsent. confirm must repeat the clientId. The dispatcher that owns the
// client does the moving, in order, so that it never races an attempt in flight;
// requests accepted after the purge are not touched. Purge waits up to wait for it to be
// done (zero: not at all) and reports what is left.
func (s *Service) Purge(ctx context.Context, clientID, confirm, by string, wait time.Duration) (PurgeResult, error) {
	return s.PurgeThrough(ctx, clientID, confirm, by, 0, wait)
}

// PurgeThrough is Purge of the client's requests up to sequence upTo only (0: all that
// are queued now): what a person was shown and confirmed, not what came after.
func (s *Service) PurgeThrough(ctx context.Context, clientID, confirm, by string, upTo uint64, wait time.Duration) (PurgeResult, error) {
	if err := request.ValidateClientID(clientID); err != nil {
		return PurgeResult{}, invalid("client: %s", err)
	}
	if confirm != clientID {
		return PurgeResult{}, invalid("purging %q needs confirmation: repeat the clientId as the confirmation", clientID)
	}
	res := PurgeResult{ClientID: clientID}
	lane, n, ok, err := s.q.ClientLane(ctx, clientID)
	if err != nil || !ok {
		return res, err
	}
	subject := lane.Subject()
	through, err := s.q.LastSeq(ctx, subject)
	if err != nil || through == 0 {
		return res, err
	}
	if upTo != 0 && upTo < through {
		after, err := s.q.QueuedAfter(ctx, subject, upTo)
		if err != nil {
			return res, err
		}
		through, n = upTo, n-min(n, after)
		if n == 0 {
			return res, nil // what was shown has gone since
		}
	}
	res.Through, res.Requests, res.Remaining = through, n, n
	if _, err := s.steer(ctx, clientID, by, "client purge asked for", func(st *request.Steering) {
		st.PurgeThrough = max(st.PurgeThrough, through)
	}); err != nil {
		return res, err
	}
	deadline := time.Now().Add(wait)
	for {
		head, ok, err := s.q.Head(ctx, lane)
		if err != nil {
			return res, err
		}
		if !ok || head.Seq > through {
			res.Remaining = 0
			// Done: clear the mark unless a later purge raised it meanwhile.
			_, err := s.ctl.UpdateClient(ctx, clientID, by, func(st *request.Steering) {
				if st.PurgeThrough == through {
					st.PurgeThrough = 0
				}
			})
			return res, err
		}
		if !time.Now().Before(deadline) {
			_, left, _, err := s.q.ClientLane(ctx, clientID)
			res.Remaining = min(left, n)
			return res, err
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
