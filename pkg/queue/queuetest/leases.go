package queuetest

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/penguinhq/dispatcher/pkg/queue"
)

// ExpireLeases removes every lease and heartbeat from the lease bucket's stream as the
// stream's age limit would: no delete marker, no watch event. It is what a forward jump
// of the store's clock does to the leases.
func ExpireLeases(ctx context.Context, nc *nats.Conn) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	st, err := js.Stream(ctx, "KV_"+queue.LeaseBucket)
	if err != nil {
		return err
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter("$KV."+queue.LeaseBucket+".>"))
	if err != nil {
		return err
	}
	for subj := range info.State.Subjects {
		// A purge of the subject, not a KV delete (KV streams refuse single deletes).
		if err := st.Purge(ctx, jetstream.WithPurgeSubject(subj)); err != nil {
			return fmt.Errorf("removing %s: %w", subj, err)
		}
	}
	return nil
}

// ExpireLeasesAt is ExpireLeases over a connection of its own to url.
func ExpireLeasesAt(ctx context.Context, url string) error {
	nc, err := nats.Connect(url, nats.Timeout(DialTimeout))
	if err != nil {
		return err
	}
	defer nc.Close()
	return ExpireLeases(ctx, nc)
}
