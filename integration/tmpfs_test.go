package integration

import (
	"testing"

	"github.com/penguinhq/dispatcher/pkg/fault"
)

// tmpfs mounts a file system of size bytes on a new temp dir, unmounted when the test
// ends, and returns the dir. It needs root on Linux (CI has both); without them the test
// is skipped, saying so.
func tmpfs(t testing.TB, size int) string {
	t.Helper()
	if !fault.CanMount() {
		t.Skip("skipped: mounting a small tmpfs to fill its disk needs root on Linux (CI runs as root)")
	}
	dir := t.TempDir()
	if err := fault.MountTmpfs(dir, size); err != nil {
		t.Skipf("skipped: cannot mount a tmpfs (%v); CI runs as root where it can", err)
	}
	t.Cleanup(func() { _ = fault.Unmount(dir) })
	return dir
}

// fill fills dir's file system and returns a function that frees it again.
func fill(t testing.TB, dir string) (free func()) {
	t.Helper()
	release, err := fault.FillDisk(dir)
	if err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := release(); err != nil {
			t.Errorf("freeing %s: %v", dir, err)
		}
	}
}
