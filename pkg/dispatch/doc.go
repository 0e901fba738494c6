// Package dispatch reads each client's queued requests in order and sends them to raven,
// never two attempts of one client closer than the interval, at most one in flight per
// client, and removes a request only after raven accepted it, it was dead-lettered, or a
// cancel removed it unsent.
//
// The pieces:
//
//   - The loop (dispatcher.go, loop.go, partitions.go): runs a schedule.Scheduler (the
//     lanes, their timer heap and the policy, pure state in pkg/schedule) against a
//     Source (the queue), handing each lane that falls due to a worker.
//   - Ownership (partitions.go): the partitions a lease.Leaser (pkg/lease: leases, their
//     renewal, and the fence a new owner waits out, ADR 4) says are this instance's, each
//     open to attempts within its lease and after its fence.
//   - The attempt (attempt.go): a worker reads the head and sends it with a Sender
//     (raven); the policy decides what the answer means (schedule.Policy.Decide, pure);
//     settle.go writes the outcome's event and removes or dead-letters the request (ADR
//     9); observe.go records it for operators.
//   - Raven's budget: a governor.Governor (pkg/governor) holds each instance to its
//     share, with a token bucket, and runs adaptive mode (ADR 7).
//   - Cancel (cancel.go): the owner of a client's partition removes a queued request that
//     is not in flight, past the partition's fence and inside its lease; a sending guard
//     keeps it apart from the owner's own workers (ADR 13).
//   - What operators ask (answers.go: the Dispatcher is a pkg/introspect Answerer, from
//     what activity.go and recent.go remember) and what it counts (metrics.go).
//
// Each package this one talks to is seen through a small interface declared here; cmd/
// wires the real queue and raven client in.
package dispatch
