// Package record writes requests' events to their record (the events stream, ADR 8-11)
// without holding up the lanes that make them.
//
// A Writer queues each event it is given (Record) in a bounded buffer and returns; its
// loop (Run) stores what waits, many at once and in the order recorded, through a Sink
// (the queue's events stream, as atomic batches where they cost less), and retries what
// failed until it lands. WriteNow waits for a final event to be stored, so that the
// dispatcher removes a request only after its final event is kept (ADR 9); while writes
// fail it does not wait, and the dispatcher keeps the event in the queue instead.
package record
