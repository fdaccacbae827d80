package node

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

func TestLoadOrCreateIdentityCreatesThenReuses(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nested", "meshinfer")

	key1, created, err := LoadOrCreateIdentity(dir)
	if err != nil {
		t.Fatalf("first LoadOrCreateIdentity: %v", err)
	}
	if !created {
		t.Fatalf("first LoadOrCreateIdentity: created = false, want true")
	}
	if key1.Type() != crypto.Ed25519 {
		t.Fatalf("key type = %v, want Ed25519", key1.Type())
	}

	st, err := os.Stat(dir)
	if err != nil {
		t.Fatalf("stat data dir: %v", err)
	}
	if got := st.Mode().Perm(); got != 0o700 {
		t.Errorf("data dir mode = %04o, want 0700", got)
	}
	path := filepath.Join(dir, IdentityFile)
	st, err = os.Stat(path)
	if err != nil {
		t.Fatalf("stat key file: %v", err)
	}
	if got := st.Mode().Perm(); got != 0o600 {
		t.Errorf("key file mode = %04o, want 0600", got)
	}
	if !st.Mode().IsRegular() {
		t.Errorf("key file mode = %v, want a regular file", st.Mode())
	}
	onDisk, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read key file: %v", err)
	}

	key2, created, err := LoadOrCreateIdentity(dir)
	if err != nil {
		t.Fatalf("second LoadOrCreateIdentity: %v", err)
	}
	if created {
		t.Errorf("second LoadOrCreateIdentity: created = true, want false")
	}
	if !key1.Equals(key2) {
		t.Errorf("second LoadOrCreateIdentity returned a different key")
	}
	id1, err := peer.IDFromPrivateKey(key1)
	if err != nil {
		t.Fatalf("peer ID of first key: %v", err)
	}
	id2, err := peer.IDFromPrivateKey(key2)
	if err != nil {
		t.Fatalf("peer ID of second key: %v", err)
	}
	if id1 != id2 {
		t.Errorf("peer ID changed across loads: %s then %s", id1, id2)
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read key file after reload: %v", err)
	}
	if !bytes.Equal(onDisk, after) {
		t.Errorf("key file rewritten by a load")
	}
}

// TestLoadOrCreateIdentityRefusesBadFiles checks that an existing key file that cannot be
// used is an error and is left exactly as it was: never silently replaced.
func TestLoadOrCreateIdentityRefusesBadFiles(t *testing.T) {
	ed, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatalf("generate ed25519 key: %v", err)
	}
	edRaw, err := crypto.MarshalPrivateKey(ed)
	if err != nil {
		t.Fatalf("marshal ed25519 key: %v", err)
	}
	secp, _, err := crypto.GenerateSecp256k1Key(rand.Reader)
	if err != nil {
		t.Fatalf("generate secp256k1 key: %v", err)
	}
	secpRaw, err := crypto.MarshalPrivateKey(secp)
	if err != nil {
		t.Fatalf("marshal secp256k1 key: %v", err)
	}
	// Fixed garbage rather than crypto/rand output, so the case cannot by chance decode.
	garbage := []byte("\xde\xad\xbe\xef this is not a libp2p key \x00\x01\x02\xff\xfe")

	tests := []struct {
		name string
		data []byte
		mode os.FileMode
		// want lists substrings of which the error must contain at least one; the key
		// path is always acceptable too.
		want []string
	}{
		{name: "random bytes", data: garbage, mode: 0o600, want: []string{"corrupt"}},
		{name: "empty file", data: []byte{}, mode: 0o600, want: []string{"corrupt"}},
		{name: "truncated to half", data: edRaw[:len(edRaw)/2], mode: 0o600, want: []string{"corrupt"}},
		{name: "truncated by one byte", data: edRaw[:len(edRaw)-1], mode: 0o600, want: []string{"corrupt"}},
		{name: "type header only", data: edRaw[:2], mode: 0o600, want: []string{"corrupt"}},
		{name: "group and world readable", data: edRaw, mode: 0o644, want: []string{"chmod 600"}},
		{name: "group readable", data: edRaw, mode: 0o640, want: []string{"chmod 600"}},
		{name: "world writable", data: edRaw, mode: 0o602, want: []string{"chmod 600"}},
		{name: "secp256k1 key", data: secpRaw, mode: 0o600, want: []string{"ed25519"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, IdentityFile)
			if err := os.WriteFile(path, tc.data, 0o600); err != nil {
				t.Fatalf("write key file: %v", err)
			}
			// WriteFile's mode is filtered by the umask; set the one under test explicitly.
			if err := os.Chmod(path, tc.mode); err != nil {
				t.Fatalf("chmod key file: %v", err)
			}

			key, created, err := LoadOrCreateIdentity(dir)
			if err == nil {
				t.Fatalf("LoadOrCreateIdentity = (%v, created=%v, nil), want an error", key, created)
			}
			if key != nil || created {
				t.Errorf("LoadOrCreateIdentity = (%v, created=%v, %v), want (nil, false, error)", key, created, err)
			}
			msg := err.Error()
			if !slices.ContainsFunc(append(tc.want, path), func(s string) bool { return strings.Contains(msg, s) }) {
				t.Errorf("error %q mentions none of %q", msg, append(tc.want, path))
			}

			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("key file gone after the call: %v", err)
			}
			if !bytes.Equal(after, tc.data) {
				t.Errorf("key file replaced: %d bytes before, %d after", len(tc.data), len(after))
			}
			st, err := os.Stat(path)
			if err != nil {
				t.Fatalf("stat key file: %v", err)
			}
			if got := st.Mode().Perm(); got != tc.mode {
				t.Errorf("key file mode changed from %04o to %04o", tc.mode, got)
			}
		})
	}
}

func TestLoadOrCreateIdentityRefusesDirectory(t *testing.T) {
	for _, mode := range []os.FileMode{0o700, 0o755} {
		t.Run(mode.String(), func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, IdentityFile)
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatalf("mkdir: %v", err)
			}
			if err := os.Chmod(path, mode); err != nil {
				t.Fatalf("chmod: %v", err)
			}
			key, created, err := LoadOrCreateIdentity(dir)
			if err == nil {
				t.Fatalf("LoadOrCreateIdentity = (%v, created=%v, nil), want an error", key, created)
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name the key path %s", err, path)
			}
			st, err := os.Stat(path)
			if err != nil {
				t.Fatalf("stat: %v", err)
			}
			if !st.IsDir() {
				t.Errorf("directory at the key path replaced by %v", st.Mode())
			}
		})
	}
}

func TestDefaultDataDir(t *testing.T) {
	tests := []struct {
		name string
		xdg  string
		home string
		want string
	}{
		{name: "XDG_DATA_HOME set", xdg: "/xdg/data", home: "/home/u", want: "/xdg/data/meshinfer"},
		{name: "XDG_DATA_HOME empty", xdg: "", home: "/home/u", want: "/home/u/.local/share/meshinfer"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("XDG_DATA_HOME", tc.xdg)
			t.Setenv("HOME", tc.home)
			got, err := DefaultDataDir()
			if err != nil {
				t.Fatalf("DefaultDataDir: %v", err)
			}
			if got != tc.want {
				t.Errorf("DefaultDataDir = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestConfigWithDefaults(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string // substring of the error; "" means no error
	}{
		{name: "zero value", cfg: Config{}},
		{name: "empty mesh is defaulted", cfg: Config{Mesh: ""}},
		{name: "mesh of every allowed character", cfg: Config{Mesh: "Az09._-"}},
		{name: "mesh of 64 characters", cfg: Config{Mesh: strings.Repeat("m", 64)}},
		{name: "mesh with a space", cfg: Config{Mesh: "a b"}, wantErr: "mesh name"},
		{name: "mesh of 65 characters", cfg: Config{Mesh: strings.Repeat("m", 65)}, wantErr: "mesh name"},
		{name: "mesh with a non-ASCII letter", cfg: Config{Mesh: "ü"}, wantErr: "mesh name"},
		{name: "mesh with a slash", cfg: Config{Mesh: "a/b"}, wantErr: "mesh name"},
		{name: "known roles", cfg: Config{Roles: []Role{RoleContributor, RoleBootstrap}}},
		{name: "unknown role", cfg: Config{Roles: []Role{"oracle"}}, wantErr: "role"},
		{name: "coordinator, public API in clear text", cfg: Config{Roles: []Role{RoleCoordinator}, APIAddr: "0.0.0.0:9337"}, wantErr: "clear text"},
		{name: "TLS certificate without key", cfg: Config{TLSCert: "c.pem"}, wantErr: "--tls-key"},
		{name: "empty role", cfg: Config{Roles: []Role{""}}, wantErr: "role"},
		{name: "heartbeat at the minimum", cfg: Config{Heartbeat: 100 * time.Millisecond}},
		{name: "heartbeat 10ms", cfg: Config{Heartbeat: 10 * time.Millisecond}, wantErr: "heartbeat"},
		{name: "negative heartbeat", cfg: Config{Heartbeat: -time.Second}, wantErr: "heartbeat"},
		{name: "conns low equals high", cfg: Config{ConnsLow: 8, ConnsHigh: 8}},
		{name: "conns low above high", cfg: Config{ConnsLow: 10, ConnsHigh: 5}, wantErr: "water marks"},
		{name: "conns low above default high", cfg: Config{ConnsLow: DefaultConnsHigh + 1}, wantErr: "water marks"},
		{name: "negative conns low", cfg: Config{ConnsLow: -1}, wantErr: "water marks"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.DataDir = t.TempDir() // keep DefaultDataDir and the environment out of it
			got, err := cfg.withDefaults()
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("withDefaults(%+v) = nil error, want one mentioning %q", tc.cfg, tc.wantErr)
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("withDefaults error %q does not mention %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("withDefaults(%+v): %v", tc.cfg, err)
			}
			if got.Mesh == "" || (tc.cfg.Mesh == "" && got.Mesh != DefaultMesh) {
				t.Errorf("Mesh = %q, want %q", got.Mesh, DefaultMesh)
			}
			if tc.cfg.Mesh != "" && got.Mesh != tc.cfg.Mesh {
				t.Errorf("Mesh = %q, want the given %q", got.Mesh, tc.cfg.Mesh)
			}
			if got.ConsoleAddr != DefaultConsoleAddr {
				t.Errorf("ConsoleAddr = %q, want %q", got.ConsoleAddr, DefaultConsoleAddr)
			}
			wantHB := DefaultHeartbeat
			if tc.cfg.Heartbeat != 0 {
				wantHB = tc.cfg.Heartbeat
			}
			if got.Heartbeat != wantHB {
				t.Errorf("Heartbeat = %v, want %v", got.Heartbeat, wantHB)
			}
			wantLow, wantHigh := DefaultConnsLow, DefaultConnsHigh
			if tc.cfg.ConnsLow != 0 {
				wantLow = tc.cfg.ConnsLow
			}
			if tc.cfg.ConnsHigh != 0 {
				wantHigh = tc.cfg.ConnsHigh
			}
			if got.ConnsLow != wantLow || got.ConnsHigh != wantHigh {
				t.Errorf("ConnsLow, ConnsHigh = %d, %d, want %d, %d", got.ConnsLow, got.ConnsHigh, wantLow, wantHigh)
			}
			if !slices.Equal(got.ListenAddrs, DefaultListenAddrs) {
				t.Errorf("ListenAddrs = %q, want %q", got.ListenAddrs, DefaultListenAddrs)
			}
			if got.ProbeRoot != "/" {
				t.Errorf("ProbeRoot = %q, want %q", got.ProbeRoot, "/")
			}
			if got.Version != "dev" {
				t.Errorf("Version = %q, want %q", got.Version, "dev")
			}
			if got.Now == nil {
				t.Errorf("Now = nil, want time.Now")
			}
			if got.DataDir != cfg.DataDir {
				t.Errorf("DataDir = %q, want the given %q", got.DataDir, cfg.DataDir)
			}
		})
	}
}

// TestConfigWithDefaultsKeepsGivenValues checks that set fields are not overwritten.
func TestConfigWithDefaultsKeepsGivenValues(t *testing.T) {
	cfg := Config{
		DataDir:     t.TempDir(),
		Mesh:        "lab",
		ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"},
		ConsoleAddr: "off",
		Heartbeat:   time.Second,
		ConnsLow:    2,
		ConnsHigh:   4,
		ProbeRoot:   "/fake",
		Version:     "v1.2.3",
	}
	got, err := cfg.withDefaults()
	if err != nil {
		t.Fatalf("withDefaults: %v", err)
	}
	if got.Mesh != cfg.Mesh || got.ConsoleAddr != cfg.ConsoleAddr || got.Heartbeat != cfg.Heartbeat ||
		got.ConnsLow != cfg.ConnsLow || got.ConnsHigh != cfg.ConnsHigh || got.ProbeRoot != cfg.ProbeRoot ||
		got.Version != cfg.Version || !slices.Equal(got.ListenAddrs, cfg.ListenAddrs) {
		t.Errorf("withDefaults changed given values:\n got  %+v\n want %+v", got, cfg)
	}
}

// TestConfigWithDefaultsDataDir checks that without an identity or a data dir the data dir
// comes from DefaultDataDir, and that an explicit identity needs no data dir.
func TestConfigWithDefaultsDataDir(t *testing.T) {
	xdg := t.TempDir()
	t.Setenv("XDG_DATA_HOME", xdg)

	got, err := Config{}.withDefaults()
	if err != nil {
		t.Fatalf("withDefaults: %v", err)
	}
	if want := filepath.Join(xdg, "meshinfer"); got.DataDir != want {
		t.Errorf("DataDir = %q, want %q", got.DataDir, want)
	}

	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatalf("generate key: %v", err)
	}
	got, err = Config{Identity: key}.withDefaults()
	if err != nil {
		t.Fatalf("withDefaults with an identity: %v", err)
	}
	if got.DataDir != "" {
		t.Errorf("DataDir = %q with an explicit identity, want it left empty", got.DataDir)
	}
}
