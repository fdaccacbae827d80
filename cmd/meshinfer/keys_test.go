package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/meshinfer/meshinfer/transport/gateway"
)

var keyLine = regexp.MustCompile(`^msk_live_[a-z2-7]{52}\n$`)

// createKeyCmd runs `meshinfer keys create` and returns the key it printed and its id.
func createKeyCmd(t *testing.T, dir, name string) (plain, id string) {
	t.Helper()
	code, stdout, stderr := runCmd(t, "keys", "create", "--name", name, "--data-dir", dir)
	if code != 0 {
		t.Fatalf("keys create --name %s: exit %d\nstdout:\n%s\nstderr:\n%s", name, code, stdout, stderr)
	}
	if !keyLine.MatchString(stdout) {
		t.Fatalf("keys create printed %q on stdout, want the key alone on its line", stdout)
	}
	m := regexp.MustCompile(`key_[0-9a-f]{8}`).FindString(stderr)
	if m == "" {
		t.Fatalf("keys create does not name the key's id:\n%s", stderr)
	}
	return strings.TrimSuffix(stdout, "\n"), m
}

func TestKeysCreateListRevoke(t *testing.T) {
	dir := t.TempDir()
	code, stdout, stderr := runCmd(t, "keys", "create", "--name", "alice", "--data-dir", dir)
	if code != 0 || !keyLine.MatchString(stdout) {
		t.Fatalf("keys create: exit %d, stdout %q\nstderr:\n%s", code, stdout, stderr)
	}
	plain := strings.TrimSpace(stdout)
	wantContains(t, "keys create stderr", stderr, "only time the key is shown", "not stored", "cannot be", "shown again",
		"meshinfer keys revoke key_", filepath.Join(dir, gateway.KeysFile))
	id := regexp.MustCompile(`key_[0-9a-f]{8}`).FindString(stderr)

	data, err := os.ReadFile(filepath.Join(dir, gateway.KeysFile))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), strings.TrimPrefix(plain, gateway.KeyPrefix)) {
		t.Errorf("keys.json holds the key:\n%s", data)
	}
	ks, err := gateway.OpenKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	if k, err := ks.Check(plain); err != nil || k.ID != id || k.Name != "alice" {
		t.Fatalf("the printed key does not check: %+v, %v", k, err)
	}
	bob, bobID := createKeyCmd(t, dir, "bob")

	code, stdout, _ = runCmd(t, "keys", "list", "--data-dir", dir)
	if code != 0 {
		t.Fatalf("keys list: exit %d", code)
	}
	wantContains(t, "keys list", stdout, "ID", "NAME", "CREATED", "REVOKED", id, "alice", bobID, "bob", "2 keys, 2 live")
	if strings.Contains(stdout, gateway.KeyPrefix) {
		t.Errorf("keys list shows a key:\n%s", stdout)
	}

	code, stdout, stderr = runCmd(t, "keys", "revoke", "alice", "--data-dir", dir) // flags after the key
	if code != 0 {
		t.Fatalf("keys revoke alice: exit %d\n%s", code, stderr)
	}
	wantContains(t, "keys revoke", stdout, "revoked key "+id, `"alice"`, "from its next request")
	if _, err := ks.Check(plain); !errors.Is(err, gateway.ErrKeyRevoked) {
		t.Errorf("after keys revoke, an open store's Check = %v, want ErrKeyRevoked", err)
	}
	if _, err := ks.Check(bob); err != nil {
		t.Errorf("revoking alice affected bob: %v", err)
	}

	code, stdout, _ = runCmd(t, "keys", "revoke", "--data-dir", dir, id) // by id, flags first
	if code != 0 || !strings.Contains(stdout, "already revoked") {
		t.Errorf("revoking again: exit %d, stdout:\n%s", code, stdout)
	}

	code, stdout, _ = runCmd(t, "keys", "list", "--data-dir", dir, "--json")
	var keys []gateway.Key
	if code != 0 || json.Unmarshal([]byte(stdout), &keys) != nil {
		t.Fatalf("keys list --json: exit %d, output:\n%s", code, stdout)
	}
	if len(keys) != 2 || keys[0].ID != id || !keys[0].Revoked() || keys[1].Name != "bob" || keys[1].Revoked() {
		t.Errorf("keys list --json = %+v, want alice revoked and bob live", keys)
	}
	code, stdout, _ = runCmd(t, "keys", "list", "--data-dir", dir)
	if code != 0 || !strings.Contains(stdout, "2 keys, 1 live") {
		t.Errorf("keys list after revoking: exit %d\n%s", code, stdout)
	}

	// The name of a revoked key may be used again.
	createKeyCmd(t, dir, "alice")
}

func TestKeysCommandErrors(t *testing.T) {
	dir := t.TempDir()
	createKeyCmd(t, dir, "alice")
	empty := t.TempDir()
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout []string
		wantStderr []string
	}{
		{"no subcommand", []string{"keys"}, 2, nil, []string{"create|list|revoke"}},
		{"unknown subcommand", []string{"keys", "rotate"}, 2, nil, []string{`unknown subcommand "rotate"`}},
		{"help", []string{"keys", "--help"}, 0, []string{"keys create --name NAME"}, nil},
		{"create --help", []string{"keys", "create", "--help"}, 0, []string{"-name", "-data-dir"}, nil},
		{"create without --name", []string{"keys", "create", "--data-dir", dir}, 2, nil, []string{"--name is required"}},
		{"create with a duplicate name", []string{"keys", "create", "--name", "alice", "--data-dir", dir}, 1, nil,
			[]string{`already named "alice"`, "meshinfer keys revoke alice"}},
		{"create with a bad name", []string{"keys", "create", "--name", "alice laptop", "--data-dir", dir}, 1, nil,
			[]string{"bad key name", "letters, digits"}},
		{"create with a name like a key", []string{"keys", "create", "--name", "msk_live_abc", "--data-dir", dir}, 1, nil,
			[]string{"bad key name"}},
		{"create with a stray argument", []string{"keys", "create", "--name", "x", "--data-dir", dir, "extra"}, 2, nil,
			[]string{`unexpected argument "extra"`}},
		{"revoke without a key", []string{"keys", "revoke", "--data-dir", dir}, 2, nil, []string{"say which key"}},
		{"revoke an unknown id", []string{"keys", "revoke", "key_00000000", "--data-dir", dir}, 1, nil,
			[]string{`no key has the id or name "key_00000000"`, "meshinfer keys list"}},
		{"revoke an unknown name", []string{"keys", "revoke", "--data-dir", dir, "mallory"}, 1, nil,
			[]string{`no key has the id or name "mallory"`}},
		{"revoke in an empty dir", []string{"keys", "revoke", "--data-dir", empty, "alice"}, 1, nil,
			[]string{`no key has the id or name "alice"`}},
		{"revoke two keys", []string{"keys", "revoke", "--data-dir", dir, "alice", "bob"}, 2, nil, []string{`unexpected argument "bob"`}},
		{"list an empty dir", []string{"keys", "list", "--data-dir", empty}, 0,
			[]string{"no API keys", "meshinfer keys create --name NAME"}, nil},
		{"list --json of an empty dir", []string{"keys", "list", "--data-dir", empty, "--json"}, 0, []string{"[]"}, nil},
		{"list with a stray argument", []string{"keys", "list", "--data-dir", dir, "alice"}, 2, nil, []string{`unexpected argument "alice"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCmd(t, tc.args...)
			if code != tc.wantCode {
				t.Errorf("exit code = %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.wantCode, stdout, stderr)
			}
			wantContains(t, "stdout", stdout, tc.wantStdout...)
			wantContains(t, "stderr", stderr, tc.wantStderr...)
			if strings.Contains(stdout+stderr, gateway.KeyPrefix) && tc.wantCode != 0 && !strings.Contains(strings.Join(tc.args, " "), gateway.KeyPrefix) {
				t.Errorf("a failed command printed a key:\n%s%s", stdout, stderr)
			}
		})
	}
	// None of the failures changed the store.
	code, stdout, _ := runCmd(t, "keys", "list", "--data-dir", dir)
	if code != 0 || !strings.Contains(stdout, "1 keys, 1 live") {
		t.Errorf("after the failed commands: exit %d\n%s", code, stdout)
	}
	if entries, _ := os.ReadDir(empty); len(entries) != 0 {
		t.Errorf("the failed commands wrote into an empty data dir: %v", entries)
	}
}
