// Package governor keeps one dispatcher instance to its share of raven's budget (ADR 7):
// the budget all instances share (Budget: a rate and attempts in flight), the instance's
// share of it by the partitions it may send for, a token bucket that holds the share's
// rate (bucket.go), and adaptive mode (Adaptive), which cuts the rate when raven refuses
// or slows and steps it back up when raven answers in time.
//
// A Governor is pure state with the time passed in, driven by one goroutine (the
// dispatcher's loop): it is asked whether an attempt may start (MayStart), told when one
// started and how it ended (Started, Finished), and of changes of ownership and of the
// operators' budget (Count, PartitionsChanged, Steer). Operators read what it publishes
// (Published, BudgetState), from any goroutine.
package governor
