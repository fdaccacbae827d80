package gateway

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshinfer/meshinfer/internal/atomicfile"
)

// KeyPrefix starts every API key. It makes a leaked key recognisable to secret scanners and
// to people, and lets RequireKey tell a malformed key from an unknown one.
const KeyPrefix = "msk_live_"

// keySecretBytes is the entropy of a key: 32 random bytes (256 bits), so the unsalted
// SHA-256 stored for it cannot be reversed by search.
const keySecretBytes = 32

// KeyLen is the length of a key in bytes: KeyPrefix and 52 base32 characters (32 bytes, 256
// bits, in 5-bit characters: 51.2, rounded up; the last character's 4 spare bits are zero).
const KeyLen = len(KeyPrefix) + (keySecretBytes*8+4)/5

// keyEncoding is RFC 4648 base32 in lower case, without padding: no case to confuse, no '+'
// or '/' to escape, and a double click selects the whole key. Never modified.
var keyEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// KeyIDPrefix starts every key ID. An ID is KeyIDPrefix and 8 hex digits from random bytes,
// not from the secret, so that it can be shown, logged and typed without revealing anything.
const KeyIDPrefix = "key_"

// keyIDBytes is the random part of a key ID: 4 bytes, 8 hex digits; unique within a store
// (Create draws again on a collision), not across stores.
const keyIDBytes = 4

// MaxKeyName bounds a key's name in bytes: enough for "alice-laptop@example.org", short
// enough for a table column.
const MaxKeyName = 64

// MaxKeys bounds the keys of a store, revoked ones included. Check compares the presented
// key's hash with every stored one in constant time, about 14 ns each, so a full store adds
// about 15 µs to each request (BenchmarkCheck), 3 % of the coordinator's 0.5 ms budget.
// A store that reaches it must have revoked keys removed from KeysFile by hand.
const MaxKeys = 1024

// KeysFile is the name of the key store inside the data dir, mode 0600. See the package
// documentation for its format.
const KeysFile = "keys.json"

// keysLockFile is taken (flock) by Create and Revoke around their read-modify-write of
// KeysFile, so that two `meshinfer keys` commands never lose each other's change. It is
// separate from KeysFile because KeysFile is replaced by rename on every write.
const keysLockFile = "keys.lock"

// keysVersion is the version of KeysFile's format.
const keysVersion = 1

// maxKeysFile bounds how much of KeysFile is read (bytes): MaxKeys records of at most about
// 300 bytes each, indented, with room to spare.
const maxKeysFile = 1 << 20

// Errors of Check, for the HTTP layer to say what is wrong. A revoked key gives a
// *RevokedError, which matches ErrKeyRevoked.
var (
	ErrKeyMissing   = errors.New("api key missing")
	ErrKeyMalformed = errors.New("api key malformed")
	ErrKeyUnknown   = errors.New("api key unknown")
	ErrKeyRevoked   = errors.New("api key revoked")
)

// Errors of Create and Revoke.
var (
	// ErrBadName: the name is empty, too long, uses other characters, or looks like a key or
	// a key ID.
	ErrBadName = errors.New("bad key name")
	// ErrNameTaken: a live key already has the name.
	ErrNameTaken = errors.New("key name taken")
	// ErrTooManyKeys: the store holds MaxKeys keys.
	ErrTooManyKeys = errors.New("too many keys")
	// ErrKeyNotFound: no key has the ID or name given to Revoke.
	ErrKeyNotFound = errors.New("key not found")
	// ErrAlreadyRevoked: Revoke found the key revoked already; nothing changed.
	ErrAlreadyRevoked = errors.New("key already revoked")
)

// RevokedError is Check's error for a revoked key.
type RevokedError struct {
	Key Key // the revoked key; RevokedAt says when
}

func (e *RevokedError) Error() string {
	return fmt.Sprintf("api key %s revoked at %s", e.Key.ID, e.Key.RevokedAt.UTC().Format(time.RFC3339))
}

func (e *RevokedError) Is(target error) bool { return target == ErrKeyRevoked }

// Key describes an API key. It never holds the key itself.
type Key struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	RevokedAt time.Time `json:"revoked_at,omitzero"` // zero while the key is live
}

// Revoked reports whether the key was revoked.
func (k Key) Revoked() bool { return !k.RevokedAt.IsZero() }

// entry is a key as the store holds it: its description and the hash of the key.
type entry struct {
	Key
	hash [sha256.Size]byte
}

// snapshot is one version of the store. Immutable once installed.
type snapshot struct {
	// stamp names the version of KeysFile read. Writes replace the file (atomicfile), so
	// each changes its inode; a revocation changes the size as well (null becomes a time).
	stamp   atomicfile.Stamp
	entries []entry // in file order, which is creation order
}

// KeyStore holds the API keys of a coordinator in KeysFile inside a data dir. Only hashes
// are stored. It re-reads the file whenever it changed on disk, so a key created or revoked
// by another process (`meshinfer keys revoke`) counts from the next Check. Safe for
// concurrent use.
type KeyStore struct {
	dir  string
	path string

	// writeMu serializes this process's Create and Revoke; keysLockFile serializes them
	// with other processes. It is held across their read-modify-write of the file: that I/O
	// is what it guards.
	writeMu sync.Mutex

	// loadMu serializes reloads and installs, so that a snapshot read from an older file
	// never replaces one read from a newer file. Held across the read of KeysFile, by
	// design. Check takes it only when the file changed.
	loadMu sync.Mutex

	snap atomic.Pointer[snapshot] // never nil after OpenKeys
}

// OpenKeys opens the key store in dir and reads it. A missing file (or dir) is an empty
// store, not an error; OpenKeys creates nothing. A file that cannot be read or parsed is an
// error.
func OpenKeys(dir string) (*KeyStore, error) {
	if dir == "" {
		return nil, errors.New("open keys: no data dir")
	}
	s := &KeyStore{dir: dir, path: filepath.Join(dir, KeysFile)}
	s.snap.Store(&snapshot{})
	if _, err := s.refresh(); err != nil {
		return nil, err
	}
	return s, nil
}

// Path returns the path of the store's file.
func (s *KeyStore) Path() string { return s.path }

// refresh returns the current snapshot, reading the file again if it changed on disk since
// the last read: one stat per call when it did not.
func (s *KeyStore) refresh() (*snapshot, error) {
	cur := s.snap.Load()
	st, err := atomicfile.Stat(s.path)
	if err != nil {
		return nil, fmt.Errorf("read keys: %w", err)
	}
	if st.Same(cur.stamp) {
		return cur, nil
	}
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	return s.reloadLocked()
}

// reloadLocked reads the file if it differs from the installed snapshot and installs it.
// The stamp comes from the open file, so it names exactly the version read. loadMu is held.
func (s *KeyStore) reloadLocked() (*snapshot, error) {
	cur := s.snap.Load()
	f, err := atomicfile.OpenPrivate(s.path, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		if cur.stamp.Exists() {
			cur = &snapshot{}
			s.snap.Store(cur)
		}
		return cur, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read keys: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read keys: %w", err)
	}
	st := atomicfile.StampOf(fi)
	if st.Same(cur.stamp) {
		return cur, nil
	}
	data, err := io.ReadAll(io.LimitReader(f, maxKeysFile+1))
	if err != nil {
		return nil, fmt.Errorf("read keys %s: %w", s.path, err)
	}
	if len(data) > maxKeysFile {
		return nil, fmt.Errorf("keys file %s is larger than %d MiB, so it is not a key store", s.path, maxKeysFile>>20)
	}
	entries, err := decodeKeys(data)
	if err != nil {
		return nil, fmt.Errorf("keys file %s: %w; restore it from a backup or move it away and create keys again", s.path, err)
	}
	next := &snapshot{stamp: st, entries: entries}
	s.snap.Store(next)
	return next, nil
}

// List returns the keys, revoked ones included, in creation order. It reads the file again
// if it changed; if that fails it returns the keys last read (Check fails instead).
func (s *KeyStore) List() []Key {
	snap, err := s.refresh()
	if err != nil {
		snap = s.snap.Load()
	}
	keys := make([]Key, len(snap.entries))
	for i, e := range snap.entries {
		keys[i] = e.Key
	}
	return keys
}

// Check returns the key whose plaintext is given. Its errors match ErrKeyMissing (empty),
// ErrKeyMalformed (not KeyPrefix and 52 base32 characters), ErrKeyUnknown or ErrKeyRevoked
// (a *RevokedError, with the key and when it was revoked); any other error means the store
// could not be read, and the caller must refuse the request.
//
// The hash of plaintext is compared with every stored hash in constant time, and the scan
// does not stop at a match, so the time taken says nothing about which stored key is closest.
func (s *KeyStore) Check(plaintext string) (Key, error) {
	h, err := hashKey(plaintext)
	if err != nil {
		return Key{}, err
	}
	snap, err := s.refresh()
	if err != nil {
		return Key{}, err
	}
	found := -1
	for i := range snap.entries {
		if subtle.ConstantTimeCompare(h[:], snap.entries[i].hash[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return Key{}, ErrKeyUnknown
	}
	k := snap.entries[found].Key
	if k.Revoked() {
		return Key{}, &RevokedError{Key: k}
	}
	return k, nil
}

// hashKey checks the form of plaintext and returns its SHA-256.
func hashKey(plaintext string) ([sha256.Size]byte, error) {
	if plaintext == "" {
		return [sha256.Size]byte{}, ErrKeyMissing
	}
	if len(plaintext) != KeyLen || !strings.HasPrefix(plaintext, KeyPrefix) {
		return [sha256.Size]byte{}, ErrKeyMalformed
	}
	body := plaintext[len(KeyPrefix):]
	for i := 0; i < len(body); i++ {
		if c := body[i]; !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
			return [sha256.Size]byte{}, ErrKeyMalformed
		}
	}
	// The last character holds the secret's last bit and 4 zero bits: value 0 or 16. Any
	// other is a spelling keyEncoding never writes.
	if last := body[len(body)-1]; last != 'a' && last != 'q' {
		return [sha256.Size]byte{}, ErrKeyMalformed
	}
	return sha256.Sum256([]byte(plaintext)), nil
}

// Create makes a new key named name and returns it in plaintext, the only time it exists
// outside its owner's hands: the store keeps its hash only. Names are unique among live keys
// (see ValidateKeyName for their form). now is the creation time. Create makes the data dir
// (mode 0700) if needed.
func (s *KeyStore) Create(name string, now time.Time) (plaintext string, k Key, err error) {
	if err := ValidateKeyName(name); err != nil {
		return "", Key{}, err
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return "", Key{}, fmt.Errorf("create key: %w", err)
	}
	unlock, err := lockKeys(filepath.Join(s.dir, keysLockFile))
	if err != nil {
		return "", Key{}, fmt.Errorf("create key: %w", err)
	}
	defer unlock()
	snap, err := s.refresh()
	if err != nil {
		return "", Key{}, fmt.Errorf("create key: %w", err)
	}
	if len(snap.entries) >= MaxKeys {
		return "", Key{}, fmt.Errorf("create key: %w: the store holds %d, revoked ones included; remove revoked keys from %s by hand",
			ErrTooManyKeys, len(snap.entries), s.path)
	}
	ids := make(map[string]bool, len(snap.entries))
	for _, e := range snap.entries {
		if e.Name == name && !e.Revoked() {
			return "", Key{}, fmt.Errorf("create key: %w: key %s is named %q", ErrNameTaken, e.ID, name)
		}
		ids[e.ID] = true
	}
	var secret [keySecretBytes]byte
	rand.Read(secret[:]) // never returns an error; crashes the program if the OS has no randomness
	plaintext = KeyPrefix + keyEncoding.EncodeToString(secret[:])
	k = Key{Name: name, CreatedAt: now.UTC()}
	for k.ID == "" || ids[k.ID] {
		var id [keyIDBytes]byte
		rand.Read(id[:])
		k.ID = KeyIDPrefix + hex.EncodeToString(id[:])
	}
	entries := append(slices.Clone(snap.entries), entry{Key: k, hash: sha256.Sum256([]byte(plaintext))})
	if err := s.writeLocked(entries); err != nil {
		return "", Key{}, fmt.Errorf("create key: %w", err)
	}
	return plaintext, k, nil
}

// Revoke revokes the key with the given ID, or the live key with the given name, at now.
// From then on Check refuses it, in this process at once and in any other that has the
// store open from its next Check. Revoking a key revoked already changes nothing and returns
// the key with an error matching ErrAlreadyRevoked; a name only revoked keys have revokes
// nothing either, and returns the latest of them the same way.
func (s *KeyStore) Revoke(idOrName string, now time.Time) (Key, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	snap, err := s.refresh()
	if err != nil {
		return Key{}, fmt.Errorf("revoke key: %w", err)
	}
	if i := find(snap.entries, idOrName); i < 0 {
		return Key{}, fmt.Errorf("revoke key: %w: no key has the id or name %q", ErrKeyNotFound, idOrName)
	}
	unlock, err := lockKeys(filepath.Join(s.dir, keysLockFile))
	if err != nil {
		return Key{}, fmt.Errorf("revoke key: %w", err)
	}
	defer unlock()
	if snap, err = s.refresh(); err != nil { // another process may have written meanwhile
		return Key{}, fmt.Errorf("revoke key: %w", err)
	}
	i := find(snap.entries, idOrName)
	if i < 0 {
		return Key{}, fmt.Errorf("revoke key: %w: no key has the id or name %q", ErrKeyNotFound, idOrName)
	}
	if k := snap.entries[i].Key; k.Revoked() {
		return k, fmt.Errorf("revoke key: %w: %s at %s", ErrAlreadyRevoked, k.ID, k.RevokedAt.UTC().Format(time.RFC3339))
	}
	entries := slices.Clone(snap.entries)
	entries[i].RevokedAt = now.UTC()
	if err := s.writeLocked(entries); err != nil {
		return Key{}, fmt.Errorf("revoke key: %w", err)
	}
	return entries[i].Key, nil
}

// find returns the index of the key with ID idOrName, else of the live key named idOrName,
// else of the latest revoked key of that name; -1 if none. Names never have the form of an
// ID, so the two cannot be confused.
func find(entries []entry, idOrName string) int {
	found := -1
	for i, e := range entries {
		switch {
		case e.ID == idOrName:
			return i
		case e.Name == idOrName && !e.Revoked():
			found = i
		case e.Name == idOrName && (found < 0 || entries[found].Revoked() && e.RevokedAt.After(entries[found].RevokedAt)):
			found = i
		}
	}
	return found
}

// ValidateKeyName checks a key name: 1 to MaxKeyName bytes of ASCII letters, digits and
// '.', '_', '-', '@', '+', starting with a letter or digit; not of the form of a key ID (so
// Revoke can take either) and not starting with "msk_" (so a key pasted by mistake is not
// stored in the clear). Errors match ErrBadName.
func ValidateKeyName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty", ErrBadName)
	case len(name) > MaxKeyName:
		return fmt.Errorf("%w: %d bytes, at most %d", ErrBadName, len(name), MaxKeyName)
	case strings.HasPrefix(name, "msk_"):
		return fmt.Errorf("%w: names may not start with msk_, which starts API keys", ErrBadName)
	case validKeyID(name):
		return fmt.Errorf("%w: %q has the form of a key id", ErrBadName, name)
	case !isAlnum(name[0]):
		return fmt.Errorf("%w: %q must start with a letter or digit", ErrBadName, name)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !isAlnum(c) && !strings.ContainsRune("._-@+", rune(c)) {
			return fmt.Errorf("%w: %q: use letters, digits and . _ - @ + only", ErrBadName, name)
		}
	}
	return nil
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// validKeyID reports whether id is KeyIDPrefix and 8 lower-case hex digits.
func validKeyID(id string) bool {
	rest, ok := strings.CutPrefix(id, KeyIDPrefix)
	if !ok || len(rest) != 2*keyIDBytes {
		return false
	}
	for i := 0; i < len(rest); i++ {
		if c := rest[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// keysDoc is KeysFile's JSON.
type keysDoc struct {
	Version int         `json:"version"`
	Keys    []keyRecord `json:"keys"`
}

type keyRecord struct {
	ID        string     `json:"id"`
	Name      string     `json:"name"`
	SHA256    string     `json:"sha256"` // hex SHA-256 of the whole key, prefix included
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at"` // null while live
}

// decodeKeys parses KeysFile strictly: known fields only, valid values, IDs and hashes
// unique, names unique among live keys, at most MaxKeys.
func decodeKeys(data []byte) ([]entry, error) {
	var doc keysDoc
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("malformed (%w)", err)
	}
	if dec.More() {
		return nil, errors.New("malformed (data after the key list)")
	}
	if doc.Version != keysVersion {
		return nil, fmt.Errorf("format version %d, this build reads version %d", doc.Version, keysVersion)
	}
	if len(doc.Keys) > MaxKeys {
		return nil, fmt.Errorf("%d keys, at most %d", len(doc.Keys), MaxKeys)
	}
	entries := make([]entry, 0, len(doc.Keys))
	ids := make(map[string]bool, len(doc.Keys))
	hashes := make(map[[sha256.Size]byte]bool, len(doc.Keys))
	live := make(map[string]bool, len(doc.Keys))
	for i, r := range doc.Keys {
		e := entry{Key: Key{ID: r.ID, Name: r.Name, CreatedAt: r.CreatedAt}}
		if r.RevokedAt != nil {
			e.RevokedAt = *r.RevokedAt
		}
		nameErr := ValidateKeyName(r.Name)
		hashOK := len(r.SHA256) == 2*sha256.Size && strings.ToLower(r.SHA256) == r.SHA256
		if hashOK { // hex.Decode needs the length checked first: it writes past dst otherwise
			_, err := hex.Decode(e.hash[:], []byte(r.SHA256))
			hashOK = err == nil
		}
		switch {
		case !validKeyID(r.ID):
			return nil, fmt.Errorf("key %d: id %q is not %s and 8 hex digits", i+1, r.ID, KeyIDPrefix)
		case ids[r.ID]:
			return nil, fmt.Errorf("key %d: id %s repeats", i+1, r.ID)
		case nameErr != nil:
			return nil, fmt.Errorf("key %s: %w", r.ID, nameErr)
		case !hashOK:
			return nil, fmt.Errorf("key %s: sha256 is not 64 lower-case hex digits", r.ID)
		case hashes[e.hash]:
			return nil, fmt.Errorf("key %s: the same hash as another key", r.ID)
		case r.CreatedAt.IsZero():
			return nil, fmt.Errorf("key %s: created_at is missing", r.ID)
		case r.RevokedAt != nil && r.RevokedAt.IsZero():
			return nil, fmt.Errorf("key %s: revoked_at is the zero time; use null for a live key", r.ID)
		case !e.Revoked() && live[r.Name]:
			return nil, fmt.Errorf("key %s: two live keys are named %q", r.ID, r.Name)
		}
		ids[r.ID], hashes[e.hash] = true, true
		if !e.Revoked() {
			live[r.Name] = true
		}
		entries = append(entries, e)
	}
	return entries, nil
}

func encodeKeys(entries []entry) ([]byte, error) {
	doc := keysDoc{Version: keysVersion, Keys: make([]keyRecord, len(entries))}
	for i, e := range entries {
		r := keyRecord{ID: e.ID, Name: e.Name, SHA256: hex.EncodeToString(e.hash[:]), CreatedAt: e.CreatedAt}
		if e.Revoked() {
			t := e.RevokedAt
			r.RevokedAt = &t
		}
		doc.Keys[i] = r
	}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// writeLocked replaces KeysFile with entries (atomicfile.WriteFile: mode 0600, a crash
// leaves the old store or the new one, never a torn one). The new version is installed as
// the current snapshot. writeMu and the lock file are held.
func (s *KeyStore) writeLocked(entries []entry) error {
	data, err := encodeKeys(entries)
	if err != nil {
		return err
	}
	st, err := atomicfile.WriteFile(s.path, data)
	if err != nil {
		return err // the next refresh reads whatever the file holds
	}
	s.loadMu.Lock()
	s.snap.Store(&snapshot{stamp: st, entries: entries})
	s.loadMu.Unlock()
	return nil
}
