//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package gateway

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockKeys takes an exclusive advisory lock (flock) on the lock file at path, creating it
// (mode 0600) if needed, and waits for it. The lock is released by unlock, or by the
// kernel when the process dies, so a crash never leaves the store locked.
func lockKeys(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock keys: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock keys: %w", err)
	}
	return func() { f.Close() }, nil // closing the only descriptor releases the lock
}
