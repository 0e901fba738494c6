// Package request holds what ingest, the queue and the dispatcher agree on about one
// request: its id, its clientId and how that id becomes a subject token, the header names
// a stored request carries, and the errors a queue reports when it will not take one.
//
// It is a leaf: it imports nothing of the project and nothing of NATS.
package request
