package fault

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// FillDisk writes a file into dir until its file system is full (ENOSPC), and returns a
// function that removes the file again.
func FillDisk(dir string) (free func() error, err error) {
	path := filepath.Join(dir, "fault-filler")
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("filling %s: %w", dir, err)
	}
	// Big writes first, then smaller ones into what is left, to the last byte.
	for _, size := range []int{64 << 10, 4 << 10, 512, 1} {
		buf := make([]byte, size)
		for {
			if _, err = f.Write(buf); err != nil {
				break
			}
		}
		if !errors.Is(err, syscall.ENOSPC) {
			break
		}
	}
	_ = f.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		_ = os.Remove(path)
		return nil, fmt.Errorf("filling %s ended with %w, not a full disk", dir, err)
	}
	return func() error { return os.Remove(path) }, nil
}
