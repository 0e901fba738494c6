package integration

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// tmpfs mounts a file system of size bytes on a new temp dir, unmounted when the test
// ends, and returns the dir. It needs root (CI runs as root); without it the test is
// skipped, saying so.
func tmpfs(t testing.TB, size int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipped: mounting a small tmpfs to fill its disk needs root (CI runs as root)")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+itoa(size)); err != nil {
		t.Skipf("skipped: cannot mount a tmpfs (%v); CI runs as root where it can", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// fill writes a file into dir until its file system is full, and returns a function that
// removes it again.
func fill(t testing.TB, dir string) (free func()) {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatalf("filling %s: %v", dir, err)
	}
	buf := make([]byte, 64<<10)
	for {
		if _, err = f.Write(buf); err != nil {
			break
		}
	}
	f.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("filling %s ended with %v, want ENOSPC", dir, err)
	}
	return func() {
		if err := os.Remove(path); err != nil {
			t.Errorf("freeing %s: %v", dir, err)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
