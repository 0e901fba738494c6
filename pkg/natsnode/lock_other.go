//go:build !unix

package natsnode

// storeLock is nothing where flock is not: the store directory is not locked there.
type storeLock struct{}

func lockStore(string) (*storeLock, error) { return &storeLock{}, nil }

func (*storeLock) release() {}
