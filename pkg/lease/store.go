package lease

import (
	"context"

	"github.com/penguinhq/dispatcher/pkg/request"
)

// Store keeps partition leases that expire unless renewed, in a store all
// dispatcher instances share (the queue's KV bucket).
type Store interface {
	// Heartbeat says instance id is alive for another TTL; Leave says it is gone.
	Heartbeat(ctx context.Context, id string) error
	Leave(ctx context.Context, id string) error
	// Members lists the instances alive now.
	Members(ctx context.Context) ([]string, error)
	// Acquire takes partition p if nobody holds it; ok is false when somebody does.
	Acquire(ctx context.Context, p int, owner string) (rev uint64, ok bool, err error)
	// Renew extends owner's lease by compare-and-swap on rev; ok is false when it is gone.
	Renew(ctx context.Context, p int, owner string, rev uint64) (newRev uint64, ok bool, err error)
	// Release gives p up if rev is still current.
	Release(ctx context.Context, p int, rev uint64) error
	// ReleaseAll gives up every lease held by owner, at whatever revision.
	ReleaseAll(ctx context.Context, owner string) (int, error)
	// Written says whether anything (a lease, a heartbeat) was ever written to the store.
	// A watch sees every renewal of a store never written to when it began; otherwise a
	// lease renewed and then removed early by the store's clock before the watch began
	// went unseen, and partitions taken over wait a TTL (see Leaser).
	Written(ctx context.Context) (bool, error)
	// WatchLeases calls fn with every lease taken, renewed or released and every
	// heartbeat written or removed, those in place first, each with the store's revision
	// of the change; lost hears that the watch ended before it was stopped.
	WatchLeases(ctx context.Context, fn func(request.LeaseChange), lost func(error)) (stop func(), err error)
}
