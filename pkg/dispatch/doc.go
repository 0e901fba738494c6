// Package dispatch reads each client's queued requests in order and sends them to raven,
// never two attempts of one client closer than the interval, at most one in flight per
// client, and removes a request only after raven accepted it, it was dead-lettered, or a
// cancel removed it unsent.
//
// The pieces:
//
//   - Policy: interval, retry backoff with jitter, and when to give up.
//   - Scheduler: the lanes (one per client with a backlog) and a timer heap of when each
//     may next start an attempt. It is pure state with the time passed in, so its rules are
//     tested exactly with a fake clock.
//   - Dispatcher: runs a Scheduler against a Source (the queue) and a Sender (raven),
//     starting a worker for each lane that falls due.
//   - Cancel (cancel.go): the owner of a client's partition removes a queued request that
//     is not in flight, past the partition's fence and inside its lease; a sending guard
//     keeps it apart from the owner's own workers (ADR 13).
//
// Each package this one talks to is seen through a small interface declared here; cmd/
// wires the real queue and raven client in.
package dispatch
