package fault

import (
	"os"
	"strconv"
	"syscall"
)

// CanMount says whether this process may mount a file system (it runs as root).
func CanMount() bool { return os.Geteuid() == 0 }

// MountTmpfs mounts a tmpfs of size bytes on dir: a small disk to fill.
func MountTmpfs(dir string, size int) error {
	return syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+strconv.Itoa(size))
}

// Unmount detaches the file system mounted on dir.
func Unmount(dir string) error { return syscall.Unmount(dir, syscall.MNT_DETACH) }
