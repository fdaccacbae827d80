// Package atomicfile replaces small files whole and tells cheaply whether one changed: the
// consent record (mesh/participation) and the API keys (transport/gateway) are written and
// watched through it.
//
// Invariants: WriteFile leaves the old file or the new one at the path, never a torn one,
// and the new one has mode 0600 (written to a temporary file in the same directory, synced,
// renamed over the path, the directory synced). A Stamp names one version of a file: two
// stamps are Same only if they name the same file (device and inode, which a WriteFile
// changes) with the same size and modification time, so a replacement by WriteFile is always
// seen, at the cost of one stat.
//
// Like every package under internal/, it imports nothing of the project, only the standard
// library (testnet/deps_test.go enforces it).
package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// WriteFile replaces the file at path with data, mode 0600, and returns the Stamp of the
// version it wrote. The directory must exist. A temporary file ".<name>-*.tmp" is written
// next to path, synced and renamed over it, then the directory is synced, so that a crash
// leaves the old content or the new one. On error the temporary file is removed; an error of
// the final directory sync comes after the rename (the new content is in place, maybe not
// durable yet), with a zero Stamp.
func WriteFile(path string, data []byte) (Stamp, error) {
	dir, name := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+name+"-*.tmp") // mode 0600
	if err != nil {
		return Stamp{}, err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	var fi fs.FileInfo
	if err == nil {
		fi, err = f.Stat() // rename keeps the inode, size and modification time
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return Stamp{}, err
	}
	if err := SyncDir(dir); err != nil {
		return Stamp{}, err
	}
	return Stamp{fi: fi}, nil
}

// SyncDir makes a rename or removal in dir durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// Stamp identifies one version of a file: the file itself (device and inode), its size and
// its modification time. The zero Stamp is a file that does not exist.
type Stamp struct {
	fi fs.FileInfo // nil: the file does not exist
}

// Stat returns the Stamp of the file at path: the zero Stamp, and no error, if there is
// none.
func Stat(path string) (Stamp, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Stamp{}, nil
	}
	if err != nil {
		return Stamp{}, err
	}
	return Stamp{fi: fi}, nil
}

// StampOf returns the Stamp of the file fi describes (from an open file's Stat, so that the
// stamp names exactly the version read); nil is a file that does not exist.
func StampOf(fi fs.FileInfo) Stamp { return Stamp{fi: fi} }

// Exists reports whether the stamped file existed.
func (s Stamp) Exists() bool { return s.fi != nil }

// Same reports whether s and o name the same version of a file: both absent, or the same
// file with the same size and modification time.
func (s Stamp) Same(o Stamp) bool {
	if s.fi == nil || o.fi == nil {
		return s.fi == nil && o.fi == nil
	}
	return os.SameFile(s.fi, o.fi) && s.fi.Size() == o.fi.Size() && s.fi.ModTime().Equal(o.fi.ModTime())
}
