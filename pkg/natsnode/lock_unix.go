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
	"time"
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
	// A server of this process that was just shut down lets its lock go a moment after
	// (a test that restarts its server itself): that is waited for, a little.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		pid := holder(path)
		if pid == os.Getpid() && time.Now().Before(deadline) {
			continue
		}
		_ = f.Close()
		who := "another process"
		if pid > 0 {
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
