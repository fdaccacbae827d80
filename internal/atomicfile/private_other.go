//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package atomicfile

import "io/fs"

// Elsewhere the open follows links and ownership is not checked: only the regular-file check
// of OpenPrivate applies.
const noFollow = 0

func isSymlinkRefused(error) bool { return false }

func ownedByMe(fs.FileInfo) bool { return true }
