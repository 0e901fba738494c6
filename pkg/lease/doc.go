// Package lease shares the partitions among dispatcher instances (ADR 4): each partition
// is held through a lease in a Store all instances share (the queue's KV bucket), which
// expires unless renewed.
//
// A Leaser takes this instance's share of the partitions, renews what it holds, hands back
// what is over its share once its loop has drained it, and lets go of what it could not
// renew in time. It tells the dispatcher's loop through Events: a partition Acquired (no
// attempt before its fence, NotBefore), Renewed (attempts may start until ValidUntil),
// Lost, or to Release (drain it and close Done).
//
// The fence: a new holder starts no attempt before every earlier holder has stopped. The
// Leaser watches every lease written (watch.go) and times each other instance's last
// renewal by its own clock, so that a lease the store's clock removed early cannot let two
// instances send for one client (see Leaser). pkg/dispatch/dispatchsim checks it over
// many seeds against a simulated store held to the real one by a conformance suite.
//
//   - leaser.go: the Leaser, its rounds, renewals, hand-backs and stop.
//   - acquire.go: taking free partitions up to the share.
//   - watch.go: the watch of the store, and the fence it gives.
//   - store.go: what a Store promises.
package lease
