package node

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshinfer/meshinfer/mesh/probe"
)

// laptopFacts are the facts of a machine with distinctive strings, so that a record that held
// any of them would be caught.
var laptopFacts = probe.DeviceFacts{CPUModel: "Intel(R) Core(TM) i7-1185G7 @ 3.00GHz", Cores: 8, RAMGiB: 32,
	GPUs: []string{"intel", "nvidia NVIDIA GeForce RTX 3050 Laptop GPU"}}

func mustDevice(t *testing.T, dir string, f probe.DeviceFacts) Device {
	t.Helper()
	d, err := LoadOrCreateDevice(dir, f)
	if err != nil {
		t.Fatalf("LoadOrCreateDevice: %v", err)
	}
	if !ValidDeviceID(d.ID) {
		t.Fatalf("device id %q is not %s and 32 lower-case hex digits", d.ID, DeviceIDPrefix)
	}
	return d
}

// The id is made once per data dir, then the same on every load, whatever order the probe
// listed the GPUs in; the record is 0600 in a 0700 dir.
func TestDeviceIDStableAcrossLoads(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nested", "meshinfer")
	first := mustDevice(t, dir, laptopFacts)
	if !first.Created || first.Previous != "" {
		t.Fatalf("first load = %+v, want created", first)
	}
	for _, p := range []string{dir, filepath.Join(dir, DeviceFile)} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]os.FileMode{true: 0o700, false: 0o600}[st.IsDir()]; st.Mode().Perm() != want {
			t.Errorf("%s has mode %04o, want %04o", p, st.Mode().Perm(), want)
		}
	}
	reordered := laptopFacts
	reordered.GPUs = slices.Clone(laptopFacts.GPUs)
	slices.Reverse(reordered.GPUs)
	for i, f := range []probe.DeviceFacts{laptopFacts, reordered, laptopFacts} {
		if d := mustDevice(t, dir, f); d != (Device{ID: first.ID}) {
			t.Fatalf("load %d = %+v, want %s, neither created nor changed", i, d, first.ID)
		}
	}
}

// Two data dirs on one machine have two salts, so two ids; and the id hashes the salt: the
// same facts with another salt give another id.
func TestDeviceIDDiffersBySalt(t *testing.T) {
	a, b := mustDevice(t, t.TempDir(), laptopFacts), mustDevice(t, t.TempDir(), laptopFacts)
	if a.ID == b.ID {
		t.Fatalf("two data dirs have the same device id %s", a.ID)
	}
	salt := bytes.Repeat([]byte{7}, deviceSaltBytes)
	other := slices.Clone(salt)
	other[deviceSaltBytes-1] ^= 1
	if x, y := deriveDeviceID(salt, laptopFacts), deriveDeviceID(other, laptopFacts); x == y {
		t.Fatalf("salts that differ in one bit give the same id %s", x)
	}
	if x, y := deriveDeviceID(salt, laptopFacts), deriveDeviceID(salt, laptopFacts); x != y || !ValidDeviceID(x) {
		t.Fatalf("one salt and facts give %s, then %s", x, y)
	}
}

// The record holds the version, the salt and the id and nothing else: none of the facts,
// and the id is not the hash of the facts alone (the salt is needed to check a guess).
func TestDeviceRecordRevealsNoFact(t *testing.T) {
	dir := t.TempDir()
	d := mustDevice(t, dir, laptopFacts)
	data, err := os.ReadFile(filepath.Join(dir, DeviceFile))
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	if keys := slices.Sorted(maps.Keys(rec)); !slices.Equal(keys, []string{"id", "salt", "version"}) || rec["id"] != d.ID {
		t.Fatalf("record %s: want exactly version, salt and the id %s", data, d.ID)
	}
	salt, err := hex.DecodeString(rec["salt"].(string))
	if err != nil || len(salt) != deviceSaltBytes {
		t.Fatalf("salt %v is not %d bytes in hex: %v", rec["salt"], deviceSaltBytes, err)
	}
	// The strings among the facts, and the names of the facts (the numbers could be
	// anywhere in hex digits).
	facts := append([]string{laptopFacts.CPUModel, "cpu", "cores", "gpu", "ram"}, laptopFacts.GPUs...)
	for _, fact := range facts {
		if strings.Contains(strings.ToLower(string(data)), strings.ToLower(fact)) {
			t.Errorf("record holds %q:\n%s", fact, data)
		}
	}
	// Control: the check above finds a fact where there is one.
	if !strings.Contains(string(laptopFacts.Canonical()), laptopFacts.CPUModel) {
		t.Fatalf("control: the canonical facts do not hold the CPU model: %s", laptopFacts.Canonical())
	}
	// The id is keyed by the record's salt: without it (an empty key), the facts give
	// another id.
	if deriveDeviceID(salt, laptopFacts) != d.ID || deriveDeviceID(nil, laptopFacts) == d.ID {
		t.Fatalf("the id %s is not the facts keyed with the record's salt", d.ID)
	}
}

// New facts (a GPU added) give a new id under the same salt, named with the old one, and
// kept from then on; the old facts give the old id back.
func TestDeviceIDFollowsTheHardware(t *testing.T) {
	dir := t.TempDir()
	before := mustDevice(t, dir, laptopFacts)
	saltOf := func() string {
		data, err := os.ReadFile(filepath.Join(dir, DeviceFile))
		if err != nil {
			t.Fatal(err)
		}
		var rec deviceRecord
		if err := json.Unmarshal(data, &rec); err != nil {
			t.Fatal(err)
		}
		return rec.Salt
	}
	salt := saltOf()
	upgraded := laptopFacts
	upgraded.GPUs = append(slices.Clone(laptopFacts.GPUs), "amd AMD Radeon RX 7800 XT")
	after := mustDevice(t, dir, upgraded)
	if after.ID == before.ID || after.Previous != before.ID || after.Created {
		t.Fatalf("after a GPU was added: %+v, want a new id, previous %s", after, before.ID)
	}
	if saltOf() != salt {
		t.Fatal("the salt changed with the hardware")
	}
	if again := mustDevice(t, dir, upgraded); again != (Device{ID: after.ID}) {
		t.Fatalf("the next load = %+v, want %s unchanged", again, after.ID)
	}
	if back := mustDevice(t, dir, laptopFacts); back.ID != before.ID || back.Previous != after.ID {
		t.Fatalf("with the GPU removed again: %+v, want %s back", back, before.ID)
	}
}

// A record that is not sound is refused with a way out, and never replaced.
func TestDeviceRecordRefusesBadFiles(t *testing.T) {
	good := func(t *testing.T, dir string) []byte {
		mustDevice(t, dir, laptopFacts)
		data, err := os.ReadFile(filepath.Join(dir, DeviceFile))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, path string, data []byte)
		want   string
	}{
		{"not JSON", func(t *testing.T, path string, _ []byte) { writeFile(t, path, []byte("{"), 0o600) }, "malformed"},
		{"data after", func(t *testing.T, path string, data []byte) { writeFile(t, path, append(data, "{}"...), 0o600) }, "malformed"},
		{"unknown field", func(t *testing.T, path string, data []byte) {
			writeFile(t, path, bytes.Replace(data, []byte(`"id"`), []byte(`"cpu":"x","id"`), 1), 0o600)
		}, "malformed"},
		{"other version", func(t *testing.T, path string, data []byte) {
			writeFile(t, path, bytes.Replace(data, []byte(`"version": 1`), []byte(`"version": 2`), 1), 0o600)
		}, "version 2"},
		{"short salt", func(t *testing.T, path string, data []byte) {
			var rec deviceRecord
			json.Unmarshal(data, &rec)
			writeFile(t, path, bytes.Replace(data, []byte(rec.Salt), []byte(rec.Salt[:62]), 1), 0o600)
		}, "salt"},
		{"upper-case id", func(t *testing.T, path string, data []byte) {
			var rec deviceRecord
			json.Unmarshal(data, &rec)
			writeFile(t, path, bytes.Replace(data, []byte(rec.ID), []byte(strings.ToUpper(rec.ID)), 1), 0o600)
		}, "id is not"},
		{"readable by others", func(t *testing.T, path string, data []byte) { writeFile(t, path, data, 0o644) }, "chmod 600"},
		{"too large", func(t *testing.T, path string, _ []byte) {
			writeFile(t, path, bytes.Repeat([]byte(" "), maxDeviceFile+1), 0o600)
		}, "not a record"},
		{"symbolic link", func(t *testing.T, path string, data []byte) {
			target := filepath.Join(t.TempDir(), "elsewhere.json")
			writeFile(t, target, data, 0o600)
			os.Remove(path)
			if err := os.Symlink(target, path); err != nil {
				t.Fatal(err)
			}
		}, "symbolic link"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, DeviceFile)
			tc.change(t, path, good(t, dir))
			before, _ := os.Lstat(path)
			_, err := LoadOrCreateDevice(dir, laptopFacts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("LoadOrCreateDevice = %v, want an error naming %q", err, tc.want)
			}
			if after, _ := os.Lstat(path); !os.SameFile(before, after) || after.ModTime() != before.ModTime() {
				t.Fatal("the bad record was replaced")
			}
		})
	}
}

func writeFile(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

func TestValidDeviceID(t *testing.T) {
	for s, want := range map[string]bool{
		"dev_0123456789abcdef0123456789abcdef":  true,
		"dev_0123456789abcdef0123456789abcde":   false,
		"dev_0123456789abcdef0123456789abcdef0": false,
		"dev_0123456789ABCDEF0123456789abcdef":  false,
		"dev_0123456789abcdeg0123456789abcdef":  false,
		"abc_0123456789abcdef0123456789abcdef":  false,
		"":                                      false,
	} {
		if ValidDeviceID(s) != want {
			t.Errorf("ValidDeviceID(%q) = %v, want %v", s, !want, want)
		}
	}
}
