// Package schedule says when each client may next be sent to: the policy (the interval,
// retry backoff with jitter, when to give up) and the Scheduler, one lane per client with
// a backlog in a timer heap of when each may next start an attempt.
//
// It is pure state with the time passed in, so its rules (G1's spacing, G4's one attempt
// in flight per client, fences, steering, purges) are tested exactly with a fake clock.
// pkg/dispatch runs it: it hands each Job that falls due to a worker and gives the
// worker's Result back.
//
//   - Policy (policy.go): interval, retry backoff with jitter, and when to give up.
//   - Scheduler (scheduler.go, lane.go): the lanes and their heap; what a lane is doing
//     (LaneInfo) for operators.
//   - Job and Result (job.go): a lane's turn handed to a worker, and how it ended.
package schedule
