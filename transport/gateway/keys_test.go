package gateway

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func openKeys(t testing.TB, dir string) *KeyStore {
	t.Helper()
	ks, err := OpenKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

func createKey(t testing.TB, ks *KeyStore, name string) (string, Key) {
	t.Helper()
	plain, k, err := ks.Create(name, t0)
	if err != nil {
		t.Fatalf("create %q: %v", name, err)
	}
	return plain, k
}

func TestKeyCreateCheckRevokeList(t *testing.T) {
	ks := openKeys(t, t.TempDir())
	if got := ks.List(); len(got) != 0 {
		t.Fatalf("a new store lists %v, want nothing", got)
	}
	alice, ka := createKey(t, ks, "alice")
	bob, kb := createKey(t, ks, "bob")

	for _, k := range []Key{ka, kb} {
		if !validKeyID(k.ID) || !k.CreatedAt.Equal(t0) || k.Revoked() {
			t.Errorf("created key %+v: want a key id, created_at %v, live", k, t0)
		}
	}
	if ka.ID == kb.ID {
		t.Errorf("two keys share the id %s", ka.ID)
	}
	for _, plain := range []string{alice, bob} {
		if len(plain) != KeyLen || !strings.HasPrefix(plain, KeyPrefix) {
			t.Errorf("key %q: want %d bytes starting with %s", plain, KeyLen, KeyPrefix)
		}
		if _, err := hashKey(plain); err != nil {
			t.Errorf("created key %q does not pass its own form check: %v", plain, err)
		}
	}
	if got, err := ks.Check(alice); err != nil || got != ka {
		t.Errorf("Check(alice) = %+v, %v; want %+v", got, err, ka)
	}
	if got, err := ks.Check(bob); err != nil || got != kb {
		t.Errorf("Check(bob) = %+v, %v; want %+v", got, err, kb)
	}
	if got := ks.List(); len(got) != 2 || got[0] != ka || got[1] != kb {
		t.Errorf("List = %+v, want [alice bob] in creation order", got)
	}

	revokedAt := t0.Add(time.Hour)
	rk, err := ks.Revoke("alice", revokedAt)
	if err != nil || rk.ID != ka.ID || !rk.RevokedAt.Equal(revokedAt) {
		t.Fatalf("Revoke(alice) = %+v, %v; want %s revoked at %v", rk, err, ka.ID, revokedAt)
	}
	_, err = ks.Check(alice)
	re, ok := errors.AsType[*RevokedError](err)
	if !ok || !errors.Is(err, ErrKeyRevoked) || re.Key.ID != ka.ID || !re.Key.RevokedAt.Equal(revokedAt) {
		t.Errorf("Check(revoked alice) error = %v, want a *RevokedError for %s at %v", err, ka.ID, revokedAt)
	}
	if _, err := ks.Check(bob); err != nil {
		t.Errorf("revoking alice affected bob: %v", err)
	}
	if _, err := ks.Revoke(kb.ID, revokedAt); err != nil {
		t.Errorf("Revoke by id: %v", err)
	}
	if _, err := ks.Check(bob); !errors.Is(err, ErrKeyRevoked) {
		t.Errorf("Check(bob revoked by id) error = %v, want ErrKeyRevoked", err)
	}
	got := ks.List()
	if len(got) != 2 || !got[0].Revoked() || !got[1].Revoked() {
		t.Errorf("List after revoking both = %+v, want both revoked", got)
	}

	// A reopened store reads the same.
	again := openKeys(t, filepath.Dir(ks.Path()))
	if l := again.List(); len(l) != 2 || l[0].ID != ka.ID || !l[0].RevokedAt.Equal(revokedAt) || l[1].Name != "bob" {
		t.Errorf("reopened store lists %+v", l)
	}

	// The name of a revoked key may be used again.
	carol, kc := createKey(t, ks, "alice")
	if got, err := again.Check(carol); err != nil || got.ID != kc.ID || got.Name != "alice" {
		t.Errorf("new key named like a revoked one: Check = %+v, %v", got, err)
	}
}

func TestKeysFileHoldsNoKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data") // Create makes it
	ks := openKeys(t, dir)
	plain, k := createKey(t, ks, "alice")
	if _, err := ks.Revoke("alice", t0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ks.Create("bob", t0); err != nil {
		t.Fatal(err)
	}

	for name, want := range map[string]os.FileMode{".": 0o700, KeysFile: 0o600, keysLockFile: 0o600} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s has mode %v, want %v", name, got, want)
		}
	}
	data, err := os.ReadFile(filepath.Join(dir, KeysFile))
	if err != nil {
		t.Fatal(err)
	}
	secret := strings.TrimPrefix(plain, KeyPrefix)
	if strings.Contains(string(data), secret) || strings.Contains(string(data), secret[:16]) {
		t.Errorf("keys.json holds the key:\n%s", data)
	}
	sum := sha256.Sum256([]byte(plain))
	if !strings.Contains(string(data), `"sha256": "`+hex.EncodeToString(sum[:])+`"`) {
		t.Errorf("keys.json does not hold the key's hex SHA-256:\n%s", data)
	}
	for _, s := range []string{`"version": 1`, `"id": "` + k.ID + `"`, `"name": "alice"`, `"created_at": "2026-05-01T12:00:00Z"`,
		`"revoked_at": "2026-05-01T12:00:00Z"`, `"revoked_at": null`} {
		if !strings.Contains(string(data), s) {
			t.Errorf("keys.json does not contain %s:\n%s", s, data)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != KeysFile && e.Name() != keysLockFile {
			t.Errorf("the data dir holds %s, want only %s and %s", e.Name(), KeysFile, keysLockFile)
		}
	}
}

func TestCheckRefusesByForm(t *testing.T) {
	ks := openKeys(t, t.TempDir())
	plain, _ := createKey(t, ks, "alice")
	body := strings.TrimPrefix(plain, KeyPrefix)
	last := body[len(body)-1:]
	other := map[string]string{"a": "q", "q": "a"}[last] // the other valid last character

	tests := []struct {
		name, key string
		want      error
	}{
		{"empty", "", ErrKeyMissing},
		{"prefix only", KeyPrefix, ErrKeyMalformed},
		{"one short", plain[:len(plain)-1], ErrKeyMalformed},
		{"one long", plain + "a", ErrKeyMalformed},
		{"test prefix", "msk_test_" + body, ErrKeyMalformed},
		{"no prefix", strings.Repeat("a", KeyLen), ErrKeyMalformed},
		{"upper case", KeyPrefix + strings.ToUpper(body), ErrKeyMalformed},
		{"digit 1", KeyPrefix + "1" + body[1:], ErrKeyMalformed},
		{"digit 8", KeyPrefix + "8" + body[1:], ErrKeyMalformed},
		{"padding", KeyPrefix + body[:len(body)-1] + "=", ErrKeyMalformed},
		{"newline", KeyPrefix + body[:25] + "\n" + body[26:], ErrKeyMalformed},
		{"spare bits set", KeyPrefix + body[:len(body)-1] + "b", ErrKeyMalformed},
		{"differs in the last bit", KeyPrefix + body[:len(body)-1] + other, ErrKeyUnknown},
		{"differs in the first character", KeyPrefix + map[bool]string{true: "b", false: "a"}[body[0] == 'a'] + body[1:], ErrKeyUnknown},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k, err := ks.Check(tc.key)
			if !errors.Is(err, tc.want) || k != (Key{}) {
				t.Errorf("Check = %+v, %v; want %v", k, err, tc.want)
			}
		})
	}
}

// Every stored hash is compared: a key is found wherever it sits, and keys that differ only
// at the end are never confused.
func TestCheckFindsEveryPosition(t *testing.T) {
	ks := openKeys(t, t.TempDir())
	var plains []string
	var keys []Key
	for i := range 20 {
		p, k := createKey(t, ks, fmt.Sprintf("k%d", i))
		plains, keys = append(plains, p), append(keys, k)
	}
	for i, p := range plains {
		if got, err := ks.Check(p); err != nil || got.ID != keys[i].ID {
			t.Errorf("Check(key %d) = %+v, %v; want %s", i, got, err, keys[i].ID)
		}
	}
}

// A key revoked or created by another process (here another KeyStore on the same dir) counts
// from the next Check, without reopening.
func TestChangesByAnotherStoreCountAtOnce(t *testing.T) {
	dir := t.TempDir()
	coordinator := openKeys(t, dir)
	cli := openKeys(t, dir)

	plain, k := createKey(t, cli, "alice")
	if got, err := coordinator.Check(plain); err != nil || got.ID != k.ID {
		t.Fatalf("a key created by another store: Check = %+v, %v; want %s", got, err, k.ID)
	}
	if _, err := openKeys(t, dir).Revoke(k.ID, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := coordinator.Check(plain); !errors.Is(err, ErrKeyRevoked) {
		t.Errorf("a key revoked by another store: Check error = %v, want ErrKeyRevoked", err)
	}
	if got := coordinator.List(); len(got) != 1 || !got[0].Revoked() {
		t.Errorf("List after another store revoked = %+v", got)
	}

	// The store's own stale view must not let it undo the other's change: cli has not read
	// the file since the revocation, and now creates a key.
	bob, _ := createKey(t, cli, "bob")
	if _, err := coordinator.Check(plain); !errors.Is(err, ErrKeyRevoked) {
		t.Errorf("a create by a store with a stale view un-revoked alice: %v", err)
	}
	if _, err := coordinator.Check(bob); err != nil {
		t.Errorf("bob: %v", err)
	}

	// The file removed: every key is unknown.
	if err := os.Remove(filepath.Join(dir, KeysFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := coordinator.Check(bob); !errors.Is(err, ErrKeyUnknown) {
		t.Errorf("keys.json removed: Check error = %v, want ErrKeyUnknown", err)
	}
}

// A store that becomes unreadable under a running coordinator fails closed: Check errs with
// none of the key errors, so the request is refused as unavailable.
func TestCheckFailsClosedOnACorruptFile(t *testing.T) {
	dir := t.TempDir()
	ks := openKeys(t, dir)
	plain, _ := createKey(t, ks, "alice")
	if err := os.WriteFile(filepath.Join(dir, KeysFile), []byte(`{"version":1,"keys":[`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := ks.Check(plain)
	if err == nil {
		t.Fatal("Check of a corrupt store succeeded")
	}
	for _, e := range []error{ErrKeyMissing, ErrKeyMalformed, ErrKeyUnknown, ErrKeyRevoked} {
		if errors.Is(err, e) {
			t.Errorf("Check error %v matches %v, want a store error", err, e)
		}
	}
	if got := ks.List(); len(got) != 1 {
		t.Errorf("List of a corrupt store = %+v, want the keys last read", got)
	}
}

func TestCreateAndRevokeErrors(t *testing.T) {
	ks := openKeys(t, t.TempDir())
	_, alice := createKey(t, ks, "alice")

	if _, _, err := ks.Create("alice", t0); !errors.Is(err, ErrNameTaken) || !strings.Contains(err.Error(), alice.ID) {
		t.Errorf("duplicate name: error = %v, want ErrNameTaken naming %s", err, alice.ID)
	}
	for _, name := range []string{"", strings.Repeat("a", MaxKeyName+1), "msk_live_abc", "msk_x", "key_0123abcd",
		"-alice", ".alice", "alice laptop", "alice/laptop", "älice", "alice\n"} {
		if _, _, err := ks.Create(name, t0); !errors.Is(err, ErrBadName) {
			t.Errorf("Create(%q) error = %v, want ErrBadName", name, err)
		}
	}
	for _, name := range []string{strings.Repeat("a", MaxKeyName), "alice@example.org", "ci+deploy", "A.b_c-d", "key_0123abcg", "key_01234567x"} {
		if err := ValidateKeyName(name); err != nil {
			t.Errorf("ValidateKeyName(%q) = %v, want ok", name, err)
		}
	}

	if _, err := ks.Revoke("nobody", t0); !errors.Is(err, ErrKeyNotFound) {
		t.Errorf("Revoke(unknown name) error = %v, want ErrKeyNotFound", err)
	}
	if _, err := ks.Revoke("key_00000000", t0); !errors.Is(err, ErrKeyNotFound) {
		t.Errorf("Revoke(unknown id) error = %v, want ErrKeyNotFound", err)
	}
	first := t0.Add(time.Hour)
	if _, err := ks.Revoke(alice.ID, first); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{alice.ID, "alice"} {
		k, err := ks.Revoke(target, first.Add(time.Hour))
		if !errors.Is(err, ErrAlreadyRevoked) || k.ID != alice.ID || !k.RevokedAt.Equal(first) {
			t.Errorf("Revoke(%s) again = %+v, %v; want %s unchanged (revoked at %v) and ErrAlreadyRevoked", target, k, err, alice.ID, first)
		}
	}
	// A live key and a revoked one share a name: the name means the live one.
	_, alice2 := createKey(t, ks, "alice")
	if k, err := ks.Revoke("alice", first); err != nil || k.ID != alice2.ID {
		t.Errorf("Revoke(alice) with a revoked and a live alice = %+v, %v; want %s", k, err, alice2.ID)
	}
}

func TestRevokeInAMissingDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "none")
	ks := openKeys(t, dir)
	if _, err := ks.Revoke("alice", t0); !errors.Is(err, ErrKeyNotFound) {
		t.Errorf("Revoke in a missing dir: error = %v, want ErrKeyNotFound", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("OpenKeys or Revoke created the dir: %v", err)
	}
}

// synthetic returns n entries with fresh ids and made-up hashes, for files too big to create
// key by key.
func synthetic(n int) []entry {
	entries := make([]entry, n)
	for i := range entries {
		entries[i] = entry{Key: Key{ID: fmt.Sprintf("key_%08x", i), Name: fmt.Sprintf("k%d", i), CreatedAt: t0},
			hash: sha256.Sum256(fmt.Appendf(nil, "%d", i))}
	}
	return entries
}

func writeEntries(t testing.TB, dir string, entries []entry) {
	t.Helper()
	data, err := encodeKeys(entries)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, KeysFile), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestCreateRefusesBeyondMaxKeys(t *testing.T) {
	dir := t.TempDir()
	writeEntries(t, dir, synthetic(MaxKeys))
	ks := openKeys(t, dir)
	if _, _, err := ks.Create("one-more", t0); !errors.Is(err, ErrTooManyKeys) {
		t.Errorf("Create in a full store: error = %v, want ErrTooManyKeys", err)
	}
	writeEntries(t, dir, synthetic(MaxKeys+1))
	if _, err := OpenKeys(dir); err == nil {
		t.Errorf("OpenKeys of %d keys succeeded, want an error", MaxKeys+1)
	}
}

func TestOpenKeysRefusesInvalidFiles(t *testing.T) {
	rec := func(id, name, hash, revoked string) string {
		return fmt.Sprintf(`{"id":%q,"name":%q,"sha256":%q,"created_at":"2026-05-01T12:00:00Z","revoked_at":%s}`, id, name, hash, revoked)
	}
	file := func(recs ...string) string { return `{"version":1,"keys":[` + strings.Join(recs, ",") + `]}` }
	h1, h2 := strings.Repeat("ab", 32), strings.Repeat("cd", 32)
	good := rec("key_0123abcd", "alice", h1, "null")
	tests := []struct{ name, file, want string }{
		{"not json", `hello`, "malformed"},
		{"torn", `{"version":1,"keys":[` + good, "malformed"},
		{"trailing data", `{"version":1,"keys":[]} {}`, "malformed"},
		{"unknown field", `{"version":1,"keys":[],"extra":1}`, "malformed"},
		{"unknown key field", file(strings.Replace(good, `"name"`, `"secret":"x","name"`, 1)), "malformed"},
		{"version", `{"version":2,"keys":[]}`, "version 2"},
		{"no version", `{"keys":[]}`, "version 0"},
		{"bad id", file(rec("key_xyz", "alice", h1, "null")), "id"},
		{"repeated id", file(good, rec("key_0123abcd", "bob", h2, "null")), "repeats"},
		{"bad name", file(rec("key_0123abcd", "a b", h1, "null")), "bad key name"},
		{"short hash", file(rec("key_0123abcd", "alice", "abcd", "null")), "sha256"},
		{"long hash", file(rec("key_0123abcd", "alice", strings.Repeat("ab", 40), "null")), "sha256"},
		{"upper-case hash", file(rec("key_0123abcd", "alice", strings.Repeat("AB", 32), "null")), "sha256"},
		{"not hex", file(rec("key_0123abcd", "alice", strings.Repeat("zz", 32), "null")), "sha256"},
		{"repeated hash", file(good, rec("key_0123abce", "bob", h1, "null")), "same hash"},
		{"no created_at", file(strings.Replace(good, `"created_at":"2026-05-01T12:00:00Z",`, "", 1)), "created_at"},
		{"zero revoked_at", file(rec("key_0123abcd", "alice", h1, `"0001-01-01T00:00:00Z"`)), "revoked_at"},
		{"two live of a name", file(good, rec("key_0123abce", "alice", h2, "null")), "two live keys"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, KeysFile), []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := OpenKeys(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "restore it from a backup") {
				t.Errorf("OpenKeys error = %v, want one about %q that says what to do", err, tc.want)
			}
		})
	}
	// Control: the good record alone, and two keys of one name when one is revoked, are valid.
	for _, f := range []string{file(good), file(good, rec("key_0123abce", "alice", h2, `"2026-05-02T00:00:00Z"`))} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, KeysFile), []byte(f), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenKeys(dir); err != nil {
			t.Errorf("OpenKeys of a valid file: %v\n%s", err, f)
		}
	}
}

// Concurrent Checks, Creates, Revokes and Lists, in one store and across two on one dir: no
// race (-race), no lost write (flock), every key checks as its final state says.
func TestKeyStoreConcurrentUse(t *testing.T) {
	dir := t.TempDir()
	stores := []*KeyStore{openKeys(t, dir), openKeys(t, dir)}
	const perWorker = 8
	type made struct {
		plain   string
		k       Key
		revoked bool
	}
	var mu sync.Mutex
	var all []made
	var wg sync.WaitGroup
	for w := range 4 {
		ks := stores[w%2]
		wg.Go(func() {
			for i := range perWorker {
				plain, k, err := ks.Create(fmt.Sprintf("w%d-%d", w, i), t0)
				if err != nil {
					t.Error(err)
					return
				}
				revoke := i%2 == 0
				if revoke {
					if _, err := ks.Revoke(k.ID, t0); err != nil {
						t.Error(err)
					}
				}
				mu.Lock()
				all = append(all, made{plain, k, revoke})
				mu.Unlock()
			}
		})
		wg.Go(func() { // a coordinator checking meanwhile
			for range 50 {
				ks.List()
				mu.Lock()
				var p string
				if len(all) > 0 {
					p = all[len(all)-1].plain
				}
				mu.Unlock()
				if p != "" {
					if _, err := ks.Check(p); err != nil && !errors.Is(err, ErrKeyRevoked) {
						t.Errorf("Check during writes: %v", err)
					}
				}
			}
		})
	}
	wg.Wait()
	fresh := openKeys(t, dir)
	if got := len(fresh.List()); got != 4*perWorker {
		t.Errorf("%d keys in the file, want %d: a write was lost", got, 4*perWorker)
	}
	for _, ks := range append(stores, fresh) {
		for _, m := range all {
			_, err := ks.Check(m.plain)
			if m.revoked != errors.Is(err, ErrKeyRevoked) || !m.revoked && err != nil {
				t.Errorf("key %s (revoked %v): Check error %v", m.k.ID, m.revoked, err)
			}
		}
	}
}

// The example in the package documentation is a well-formed key, and its sha256 is the one
// shown in the example file.
func TestDocExample(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	const key = "msk_live_abcdefghijklmnopqrstuvwxyz234567abcdefghijklmnopqrsa"
	h, err := hashKey(key)
	if err != nil {
		t.Fatalf("the documented key is refused: %v", err)
	}
	for _, s := range []string{"\t" + key + "\n", `"sha256": "` + hex.EncodeToString(h[:]) + `"`} {
		if !strings.Contains(string(doc), s) {
			t.Errorf("doc.go does not contain %s", s)
		}
	}
}

// BenchmarkCheck measures Check on a full store (MaxKeys keys): the cost the coordinator adds
// to each request for its key.
func BenchmarkCheck(b *testing.B) {
	dir := b.TempDir()
	writeEntries(b, dir, synthetic(MaxKeys-1))
	ks := openKeys(b, dir)
	plain, _ := createKey(b, ks, "bench")
	b.ResetTimer()
	for b.Loop() {
		if _, err := ks.Check(plain); err != nil {
			b.Fatal(err)
		}
	}
}
