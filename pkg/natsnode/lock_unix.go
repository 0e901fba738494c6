//go:build unix

package natsnode

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// lockFile names the file in a store directory that a running node holds locked.
const lockFile = "node.lock"

// storeLock is a store directory held by this process: an exclusive flock on a file in
// it, which the kernel lets go when the process ends, however it ends.
type storeLock struct{ f *os.File }

// lockStore takes dir for this process, or says which process holds it. nats-server does
// not lock its store: two servers on one directory both start, write the same files
// over each other, and two dispatchers on them each own every partition and send each
// request (seen: one request reached raven from both, 2 ms apart).
func lockStore(dir string) (*storeLock, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		who := "another process"
		switch pid := holder(path); {
		case pid == os.Getpid():
			who = fmt.Sprintf("another server of this process (pid %d)", pid)
		case pid > 0:
			who = fmt.Sprintf("another process (pid %d)", pid)
		}
		return nil, fmt.Errorf("the store directory %s is in use by %s: two servers on one store would overwrite each other's files and send requests twice; stop the other one, or give this one a directory of its own", dir, who)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &storeLock{f: f}, nil
}

// holder is the process id written in the lock file at path, 0 when none can be read.
func holder(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// release lets dir go (the file stays: removing it could race another process's lock).
func (l *storeLock) release() {
	if l != nil {
		_ = l.f.Close()
	}
}
