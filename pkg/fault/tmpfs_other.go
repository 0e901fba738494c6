//go:build !linux

package fault

import "errors"

// CanMount says whether this process may mount a file system: never, but on Linux.
func CanMount() bool { return false }

// MountTmpfs needs Linux.
func MountTmpfs(string, int) error { return errors.New("mounting a tmpfs needs Linux") }

// Unmount needs Linux.
func Unmount(string) error { return errors.New("unmounting needs Linux") }
