package main

import (
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/mesh/receipts"
	"github.com/meshinfer/meshinfer/node"
)

// writeReceipts creates an identity in a fresh data dir and logs three tasks served for
// requester with it: two completed on synth-tiny, one peer_lost on synth-small.
func writeReceipts(t *testing.T, requester string) string {
	t.Helper()
	dir := t.TempDir()
	key, _, err := node.LoadOrCreateIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	appendReceipts(t, dir, key, requester)
	return dir
}

func appendReceipts(t *testing.T, dir string, key crypto.PrivKey, requester string) {
	t.Helper()
	l, err := receipts.Open(dir, key)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for i, r := range []receipts.Receipt{
		{Model: "synth-tiny", TokensIn: 12, TokensOut: 64, DurationMS: 800, Outcome: receipts.Completed},
		{Model: "synth-tiny", TokensIn: 10, TokensOut: 32, DurationMS: 400, Outcome: receipts.Completed},
		{Model: "synth-small", TokensIn: 0, TokensOut: 5, DurationMS: 300, Outcome: "peer_lost"},
	} {
		r.Time, r.Requester = t0.Add(time.Duration(i)*time.Minute), requester
		if err := l.Append(r); err != nil {
			t.Fatal(err)
		}
	}
}

func newPeerID(t *testing.T) (crypto.PrivKey, string) {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return key, id.String()
}

func wantContains(t *testing.T, what, out string, subs ...string) {
	t.Helper()
	for _, s := range subs {
		if !strings.Contains(out, s) {
			t.Errorf("%s does not contain %q:\n%s", what, s, out)
		}
	}
}

func TestReceiptsListsAndTotals(t *testing.T) {
	_, requester := newPeerID(t)
	dir := writeReceipts(t, requester)

	code, stdout, stderr := runCmd(t, "receipts", "--data-dir", dir)
	if code != 0 {
		t.Fatalf("exit code = %d, want 0\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	wantContains(t, "stdout", stdout, "REQUESTER", shortID(requester), "synth-tiny", "synth-small", "peer_lost", "800ms",
		"3 tasks: 2 completed, 1 failed", "22 in, 101 out", "1.5s", "by model")
	if n := strings.Count(stdout, shortID(requester)); n != 3 {
		t.Errorf("the requester appears %d times, want one row per receipt:\n%s", n, stdout)
	}
	if strings.Contains(stdout, requester) {
		t.Errorf("the table shows the full requester ID, want the short form:\n%s", stdout)
	}

	code, stdout, stderr = runCmd(t, "receipts", "--data-dir", dir, "--json")
	if code != 0 {
		t.Fatalf("--json: exit code = %d, want 0\nstderr:\n%s", code, stderr)
	}
	var tot receipts.Totals
	if err := json.Unmarshal([]byte(stdout), &tot); err != nil {
		t.Fatalf("--json output does not decode: %v\n%s", err, stdout)
	}
	if tot.Tasks != 3 || tot.Completed != 2 || tot.Failed != 1 || tot.TokensIn != 22 || tot.TokensOut != 101 ||
		tot.Duration != 1500*time.Millisecond || tot.ByModel["synth-tiny"].Tasks != 2 || tot.ByRequester[requester].Tasks != 3 {
		t.Errorf("--json totals %+v", tot)
	}

	code, stdout, _ = runCmd(t, "receipts", "--data-dir", dir, "--verify-only")
	if code != 0 || !strings.Contains(stdout, "3 receipts verify") || strings.Contains(stdout, "REQUESTER") {
		t.Errorf("--verify-only: exit %d, stdout:\n%s", code, stdout)
	}
}

func TestReceiptsReportsATamperedLine(t *testing.T) {
	_, requester := newPeerID(t)
	dir := writeReceipts(t, requester)
	path := filepath.Join(dir, receipts.File)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tampered := strings.Replace(string(b), `"tokens_out":32`, `"tokens_out":3200`, 1)
	if tampered == string(b) {
		t.Fatal("the test did not change the log")
	}
	if err := os.WriteFile(path, []byte(tampered), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{nil, {"--json"}, {"--verify-only"}} {
		code, stdout, stderr := runCmd(t, append([]string{"receipts", "--data-dir", dir}, args...)...)
		if code != 1 {
			t.Errorf("%v: exit code = %d, want 1\nstdout:\n%s\nstderr:\n%s", args, code, stdout, stderr)
		}
		wantContains(t, "stderr", stderr, "line 2", "signature invalid", "1 lines of", "altered", "torn")
		if args == nil {
			wantContains(t, "stdout", stdout, "2 tasks: 1 completed, 1 failed")
		}
	}
}

// A log signed by another node, in this node's data dir, fails: it is not this node's work.
func TestReceiptsOfAnotherNodeFail(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := node.LoadOrCreateIdentity(dir); err != nil {
		t.Fatal(err)
	}
	other, _ := newPeerID(t)
	_, requester := newPeerID(t)
	appendReceipts(t, dir, other, requester)
	code, stdout, stderr := runCmd(t, "receipts", "--data-dir", dir)
	if code != 1 {
		t.Fatalf("exit code = %d, want 1\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	wantContains(t, "stderr", stderr, "not by this node", "3 lines of")
}

func TestReceiptsWithoutALog(t *testing.T) {
	dir := t.TempDir()
	code, stdout, stderr := runCmd(t, "receipts", "--data-dir", dir)
	if code != 0 {
		t.Fatalf("exit code = %d, want 0\nstderr:\n%s", code, stderr)
	}
	wantContains(t, "stdout", stdout, "served nothing for other peers yet")
	if _, err := os.Stat(filepath.Join(dir, receipts.File)); !os.IsNotExist(err) {
		t.Errorf("receipts created the log: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, node.IdentityFile)); !os.IsNotExist(err) {
		t.Errorf("receipts created an identity: %v", err)
	}

	code, stdout, _ = runCmd(t, "receipts", "--data-dir", dir, "--json")
	var tot receipts.Totals
	if code != 0 || json.Unmarshal([]byte(stdout), &tot) != nil || tot.Tasks != 0 {
		t.Errorf("--json without a log: exit %d, stdout %q", code, stdout)
	}
}

func TestReceiptsFlags(t *testing.T) {
	for _, args := range [][]string{{"--bogus"}, {"--json", "--verify-only"}, {"extra"}} {
		if code, _, _ := runCmd(t, append([]string{"receipts", "--data-dir", t.TempDir()}, args...)...); code != 2 {
			t.Errorf("receipts %v: exit code %d, want 2", args, code)
		}
	}
}

// A pipeline stage's parts show as the model with its layers, with the positions and steps
// it ran in place of tokens, and are totalled apart per range.
func TestReceiptsShowsStageParts(t *testing.T) {
	_, head := newPeerID(t)
	dir := writeReceipts(t, head)
	key, _, err := node.LoadOrCreateIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	l, err := receipts.Open(dir, key)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 5, 1, 13, 0, 0, 0, time.UTC)
	for i, st := range []receipts.Stage{{Lo: 0, Hi: 8, Steps: 9, Positions: 20}, {Lo: 0, Hi: 8, Steps: 3, Positions: 12}} {
		if err := l.Append(receipts.Receipt{Time: t0.Add(time.Duration(i) * time.Minute), Requester: head, Model: "synth-large",
			DurationMS: 200, Outcome: receipts.Completed, Stage: &st}); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()

	code, stdout, stderr := runCmd(t, "receipts", "--data-dir", dir)
	if code != 0 {
		t.Fatalf("exit code = %d, want 0\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	wantContains(t, "stdout", stdout, "synth-large[0-7]", "20 pos", "9 steps", "5 tasks: 4 completed, 1 failed",
		"pipeline stages    2 of those tasks: 32 positions in 12 steps", "32 pos", "12 steps")
	code, stdout, _ = runCmd(t, "receipts", "--data-dir", dir, "--json")
	var tot receipts.Totals
	if err := json.Unmarshal([]byte(stdout), &tot); code != 0 || err != nil {
		t.Fatalf("--json: exit %d, %v\n%s", code, err, stdout)
	}
	if r := tot.ByModel["synth-large[0-7]"]; r.Tasks != 2 || r.Steps != 12 || r.Positions != 32 || tot.Stages != 2 || tot.Tasks != 5 {
		t.Errorf("--json totals %+v", tot)
	}
}
