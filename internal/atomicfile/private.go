package atomicfile

import (
	"errors"
	"fmt"
	"os"
)

// ErrNotPrivate marks a data file that is not this user's own regular file: a symbolic link
// (which could point the node's writes at any file the user can write), another user's file,
// or not a regular file at all.
var ErrNotPrivate = errors.New("not a private regular file")

// OpenPrivate opens the data file at path as os.OpenFile does with flag and perm, refusing
// (ErrNotPrivate) a symbolic link at path, a file another user owns, and anything but a
// regular file. A missing file gives an error for which errors.Is(err, fs.ErrNotExist)
// holds, as from os.OpenFile. The key store, the consent record, the receipts and usage
// logs, the identity key and the device id record are opened through it.
func OpenPrivate(path string, flag int, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, flag|noFollow, perm)
	if err != nil {
		if isSymlinkRefused(err) {
			return nil, fmt.Errorf("%s: %w: it is a symbolic link; replace it with the file itself", path, ErrNotPrivate)
		}
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	switch {
	case !fi.Mode().IsRegular():
		f.Close()
		return nil, fmt.Errorf("%s: %w: it is a %v", path, ErrNotPrivate, fi.Mode().Type())
	case !ownedByMe(fi):
		f.Close()
		return nil, fmt.Errorf("%s: %w: another user owns it; check who put it there, then move it away", path, ErrNotPrivate)
	}
	return f, nil
}
