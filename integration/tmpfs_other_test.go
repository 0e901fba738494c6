//go:build !linux

package integration

import "testing"

func tmpfs(t testing.TB, size int) string {
	t.Helper()
	t.Skip("skipped: the disk-full tests mount a tmpfs, which needs Linux (CI runs on Linux)")
	return ""
}

func fill(t testing.TB, dir string) (free func()) { return func() {} }
