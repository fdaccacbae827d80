//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"syscall"
)

// noFollow makes open fail on a symbolic link at the path's last element.
const noFollow = syscall.O_NOFOLLOW

// isSymlinkRefused reports the error of an O_NOFOLLOW open of a symbolic link.
func isSymlinkRefused(err error) bool { return errors.Is(err, syscall.ELOOP) }

// ownedByMe reports whether fi's owner is this process's effective user.
func ownedByMe(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return !ok || int(st.Uid) == os.Geteuid()
}
