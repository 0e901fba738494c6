// Package natsnode runs a nats-server in this process: the standalone dispatcher's
// embedded server (StartEmbedded), each natsnode of the compose stack (StartNodeFromArgs)
// and each node of the tests' cluster (StartNode), with the StoreGuard that restarts a
// node in place once its full disk takes writes again (ADR 6).
//
// It is the only package of the service that imports nats-server. The queue (package
// queue) talks to a server through nats.go alone, so the binaries that only talk to NATS
// (ingest, dispatchctl) do not link the server; docs/architecture_test.go checks it.
package natsnode
