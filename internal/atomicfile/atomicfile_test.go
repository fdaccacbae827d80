package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f.json")
	cases := []struct {
		name string
		data string
	}{
		{"creates", "one\n"},
		{"replaces with longer", "two, longer\n"},
		{"replaces with shorter", "3\n"},
		{"replaces with nothing", ""},
	}
	prev := Stamp{}
	for _, tc := range cases {
		st, err := WriteFile(path, []byte(tc.data))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != tc.data {
			t.Fatalf("%s: file holds %q, %v; want %q", tc.name, got, err, tc.data)
		}
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: mode %v, %v; want 0600", tc.name, fi.Mode(), err)
		}
		now, err := Stat(path)
		if err != nil || !now.Same(st) || !st.Exists() {
			t.Fatalf("%s: the returned stamp is not the file's (%v)", tc.name, err)
		}
		if st.Same(prev) {
			t.Fatalf("%s: a replacement has the stamp of the version before", tc.name)
		}
		prev = st
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 1 {
		t.Fatalf("dir holds %v, %v; want the file alone (no temporary left)", entries, err)
	}
}

func TestWriteFileFails(t *testing.T) {
	dir := t.TempDir()
	if _, err := WriteFile(filepath.Join(dir, "missing", "f"), []byte("x")); err == nil {
		t.Fatal("wrote into a missing dir")
	}
	// The path is a directory: the rename fails and the temporary is removed.
	target := filepath.Join(dir, "d")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := WriteFile(target, []byte("x")); err == nil {
		t.Fatal("replaced a non-empty directory")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("dir holds %v after a failed write: the temporary was left", entries)
	}
}

func TestStampSame(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	stA, err := WriteFile(a, []byte("same"))
	if err != nil {
		t.Fatal(err)
	}
	stB, err := WriteFile(b, []byte("same"))
	if err != nil {
		t.Fatal(err)
	}
	none, err := Stat(filepath.Join(dir, "none"))
	if err != nil {
		t.Fatal(err)
	}
	again, _ := Stat(a)
	cases := []struct {
		name string
		x, y Stamp
		want bool
	}{
		{"absent and absent", none, Stamp{}, true},
		{"absent and present", none, stA, false},
		{"present and absent", stA, none, false},
		{"one file stamped twice", stA, again, true},
		{"two files of equal content", stA, stB, false},
		{"StampOf nil is absent", StampOf(nil), none, true},
	}
	for _, tc := range cases {
		if got := tc.x.Same(tc.y); got != tc.want {
			t.Errorf("%s: Same = %v, want %v", tc.name, got, tc.want)
		}
	}
	if none.Exists() || !stA.Exists() {
		t.Error("Exists is wrong")
	}
}

func TestSyncDir(t *testing.T) {
	if err := SyncDir(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if err := SyncDir(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("synced a missing dir")
	}
}
