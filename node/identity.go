package node

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/meshinfer/meshinfer/internal/atomicfile"
)

// IdentityFile is the name of the identity key inside the data dir: a libp2p-marshalled
// ed25519 private key, file mode 0600.
const IdentityFile = "identity.key"

// maxKeyFile bounds how much of the identity file is read: a marshalled ed25519 key is 68
// bytes; anything near this bound is not a key.
const maxKeyFile = 4 << 10

// DefaultDataDir returns $XDG_DATA_HOME/meshinfer, else ~/.local/share/meshinfer.
func DefaultDataDir() (string, error) {
	if x := os.Getenv("XDG_DATA_HOME"); x != "" {
		return filepath.Join(x, "meshinfer"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("find the data dir: %w; pass --data-dir", err)
	}
	return filepath.Join(home, ".local", "share", "meshinfer"), nil
}

// LoadOrCreateIdentity returns the node's identity key from dataDir, creating the dir (0700)
// and a new ed25519 key (0600) on first use. created reports whether the key is new.
//
// An existing key is never replaced: a file that cannot be parsed, is not ed25519, or can be
// read by group or others is an error that says how to fix it.
func LoadOrCreateIdentity(dataDir string) (key crypto.PrivKey, created bool, err error) {
	path := filepath.Join(dataDir, IdentityFile)
	key, err = loadIdentity(path)
	if err == nil {
		return key, false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, err
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, false, fmt.Errorf("create data dir: %w", err)
	}
	key, _, err = crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, false, fmt.Errorf("generate identity key: %w", err)
	}
	raw, err := crypto.MarshalPrivateKey(key)
	if err != nil {
		return nil, false, fmt.Errorf("encode identity key: %w", err)
	}
	// O_EXCL: if another process created the key meanwhile, fail rather than overwrite it.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("create identity key: %w", err)
	}
	if _, err := f.Write(raw); err != nil {
		f.Close()
		os.Remove(path)
		return nil, false, fmt.Errorf("write identity key: %w", err)
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return nil, false, fmt.Errorf("write identity key: %w", err)
	}
	return key, true, nil
}

// LoadIdentity returns the node's identity key from dataDir, never creating one: with none
// there, an error wrapping fs.ErrNotExist. The checks are LoadOrCreateIdentity's.
func LoadIdentity(dataDir string) (crypto.PrivKey, error) {
	return loadIdentity(filepath.Join(dataDir, IdentityFile))
}

func loadIdentity(path string) (crypto.PrivKey, error) {
	f, err := atomicfile.OpenPrivate(path, os.O_RDONLY, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("open identity key: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat identity key: %w", err)
	}
	if !st.Mode().IsRegular() || st.Size() > maxKeyFile {
		return nil, fmt.Errorf("identity key %s is not a key file; move it away to create a new identity (this changes the node's peer ID)", path)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("identity key %s has mode %04o: others could read it; run 'chmod 600 %s' and start again", path, perm, path)
	}
	raw := make([]byte, st.Size())
	if _, err := f.ReadAt(raw, 0); err != nil {
		return nil, fmt.Errorf("read identity key: %w", err)
	}
	key, err := crypto.UnmarshalPrivateKey(raw)
	if err != nil {
		return nil, fmt.Errorf("identity key %s is corrupt (%w); restore it from a backup, or move it away to create a new identity (this changes the node's peer ID)", path, err)
	}
	if key.Type() != crypto.Ed25519 {
		return nil, fmt.Errorf("identity key %s is a %v key, want ed25519; move it away to create a new identity", path, key.Type())
	}
	return key, nil
}
