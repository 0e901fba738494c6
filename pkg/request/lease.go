package request

// LeaseChange is one change to the lease store that its watch reports: a partition's
// lease taken or renewed (Owner names its holder) or released; or, with Heartbeat, an
// instance's heartbeat written (Owner names the instance) or removed as it left.
type LeaseChange struct {
	Heartbeat bool
	Partition int    // whose lease changed; none for a heartbeat
	Owner     string // empty for a release or a leaving: a removal names nobody
	Released  bool
	Rev       uint64 // the store's revision of the change
}
