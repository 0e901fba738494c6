package admin

import (
	"context"
	"time"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// MinInterval is the shortest interval an operator may set.
const MinInterval = time.Millisecond

// Steered is the steering in force: the global interval (empty when each dispatcher
// uses its configured DISPATCH_INTERVAL) and every client with a record.
type Steered struct {
	GlobalInterval string                      `json:"global_interval,omitempty"`
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
	out := Steered{Clients: cs}
	if !g.IsZero() {
		out.Global, out.GlobalInterval = &g, time.Duration(g.Interval).String()
	}
	return out, nil
}

// SetInterval sets the global interval for every dispatcher; zero restores each one's
// configured DISPATCH_INTERVAL.
func (s *Service) SetInterval(ctx context.Context, d time.Duration, by string) error {
	if d != 0 && d < MinInterval {
		return invalid("interval %s: must be at least %s, or 0 for the configured one", d, MinInterval)
	}
	if err := s.ctl.SetGlobalInterval(ctx, d, by); err != nil {
		return err
	}
	s.log.Info().Stringer("interval", d).Str("by", by).Msg("global interval set")
	return nil
}

// SetClientInterval gives one client its own interval; zero returns it to the global one.
func (s *Service) SetClientInterval(ctx context.Context, clientID string, d time.Duration, by string) (request.Steering, error) {
	if d != 0 && d < MinInterval {
		return request.Steering{}, invalid("interval %s: must be at least %s, or 0 for the global one", d, MinInterval)
	}
	return s.steer(ctx, clientID, by, "client interval set", func(st *request.Steering) { st.Interval = request.Duration(d) })
}

// Pause stops sends to one client; its requests wait, and new ones are still accepted.
func (s *Service) Pause(ctx context.Context, clientID, by string) (request.Steering, error) {
	return s.steer(ctx, clientID, by, "client paused", func(st *request.Steering) { st.Paused = true })
}

// Resume lets one client's requests go again, spaced as before.
func (s *Service) Resume(ctx context.Context, clientID, by string) (request.Steering, error) {
	return s.steer(ctx, clientID, by, "client resumed", func(st *request.Steering) { st.Paused = false })
}

func (s *Service) steer(ctx context.Context, clientID, by, what string, change func(*request.Steering)) (request.Steering, error) {
	if err := request.ValidateClientID(clientID); err != nil {
		return request.Steering{}, invalid("client: %s", err)
	}
	st, err := s.ctl.UpdateClient(ctx, clientID, by, change)
	if err != nil {
		return request.Steering{}, err
	}
	s.log.Info().Str("client_id", clientID).Str("by", by).Interface("steering", st).Msg(what)
	return st, nil
}

// PurgeResult says what a purge asked for.
type PurgeResult struct {
	ClientID string `json:"client_id"`
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
	if err := request.ValidateClientID(clientID); err != nil {
		return PurgeResult{}, invalid("client: %s", err)
	}
	if confirm != clientID {
		return PurgeResult{}, invalid("purging %q needs confirmation: repeat the clientId as the confirmation", clientID)
	}
	res := PurgeResult{ClientID: clientID}
	subject, n, ok, err := s.q.ClientSubject(ctx, clientID)
	if err != nil || !ok {
		return res, err
	}
	through, err := s.q.LastSeq(ctx, subject)
	if err != nil || through == 0 {
		return res, err
	}
	res.Through, res.Requests, res.Remaining = through, n, n
	if _, err := s.steer(ctx, clientID, by, "client purge asked for", func(st *request.Steering) {
		st.PurgeThrough = max(st.PurgeThrough, through)
	}); err != nil {
		return res, err
	}
	deadline := time.Now().Add(wait)
	for {
		head, ok, err := s.q.Head(ctx, subject)
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
			_, left, _, err := s.q.ClientSubject(ctx, clientID)
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
