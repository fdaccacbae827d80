package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// OpenPrivate opens the user's own regular files and refuses a symbolic link (which could
// aim the node's writes at any file), a directory, and another user's file; a missing file
// is fs.ErrNotExist as from os.OpenFile (issue 19).
func TestOpenPrivate(t *testing.T) {
	dir := t.TempDir()
	own := filepath.Join(dir, "keys.json")
	if err := os.WriteFile(own, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(dir, "elsewhere")
	if err := os.WriteFile(target, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "usage.jsonl")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	f, err := OpenPrivate(own, os.O_RDONLY, 0)
	if err != nil {
		t.Fatalf("own file: %v", err)
	}
	f.Close()
	if _, err := OpenPrivate(filepath.Join(dir, "missing"), os.O_RDONLY, 0); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v, want fs.ErrNotExist", err)
	}
	if _, err := OpenPrivate(dir, os.O_RDONLY, 0); !errors.Is(err, ErrNotPrivate) {
		t.Fatalf("directory: %v, want ErrNotPrivate", err)
	}
	if runtime.GOOS != "windows" {
		if _, err := OpenPrivate(link, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600); !errors.Is(err, ErrNotPrivate) {
			t.Fatalf("symbolic link: %v, want ErrNotPrivate", err)
		}
		if b, _ := os.ReadFile(target); string(b) != "precious" {
			t.Fatalf("the link's target was touched: %q", b)
		}
	}
	if os.Geteuid() == 0 { // only root can give a file away; CI runs as root
		theirs := filepath.Join(dir, "consent.json")
		if err := os.WriteFile(theirs, []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(theirs, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenPrivate(theirs, os.O_RDONLY, 0); !errors.Is(err, ErrNotPrivate) {
			t.Fatalf("another user's file: %v, want ErrNotPrivate", err)
		}
	} else {
		t.Log("not root: the other-owner case needs chown and is not run")
	}
}
