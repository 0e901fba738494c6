// Package request holds what ingest, the queue and the dispatcher agree on about one
// request: its id, its clientId and how that id becomes a subject token, the subjects and
// the header names a stored request carries, its events and the status they make, raven's
// answer as kept, a dead letter's verdict, steering and raven's budget, and the errors
// the parts pass each other across their seams (errors.go).
//
// It is a leaf: it imports nothing of the project and nothing of NATS.
package request
