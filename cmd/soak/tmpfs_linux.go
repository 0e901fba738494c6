package main

import (
	"os"
	"strconv"
	"syscall"
)

// canMount says whether this process may mount file systems (it is root).
func canMount() bool { return os.Geteuid() == 0 }

func mountTmpfs(dir string, size int) error {
	return syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+strconv.Itoa(size))
}

func unmount(dir string) { _ = syscall.Unmount(dir, syscall.MNT_DETACH) }
