// Package queue is the project's only door to NATS: it creates the streams, publishes
// accepted requests, lists and watches the clients that have a backlog, reads a client's
// head request, deletes it once sent, and moves it to the dead-letter stream. It stores
// requests' events for package record's writer (NewEventWriter) and reads them back as
// statuses. It does not link nats-server: a server running in the process is package
// natsnode's.
//
// The dispatcher names a client's queue by its request.Lane; this package alone turns a
// lane into its subject and back.
//
// Requests live in the REQUESTS stream, one subject per client:
//
//	publish to   dispatch.req.<token>
//	stored as    dispatch.req.<partition>.<token>
//
// where <token> is request.EncodeClientID(clientId) and the partition is computed by the
// server's own subject transform ({{partition(N,1)}}), so every publisher agrees on it
// without sharing code. The stream's subjects are the one-token form only: a publish
// straight to a partitioned subject finds no stream and fails, so no client can be filed
// under two partitions.
package queue
