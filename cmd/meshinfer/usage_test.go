package main

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/receipts"
	"github.com/meshinfer/meshinfer/node"
	"github.com/meshinfer/meshinfer/transport/gateway"
)

// writeUsage makes keys alice (live) and bob (revoked) in a fresh data dir and meters tasks
// for them and for a key keys.json does not know: alice two completed and one that failed
// verification (metered as zero tokens), bob one completed.
func writeUsage(t *testing.T) (dir, aliceID, bobID string) {
	t.Helper()
	dir = t.TempDir()
	_, aliceID = createKeyCmd(t, dir, "alice")
	_, bobID = createKeyCmd(t, dir, "bob")
	if code, _, stderr := runCmd(t, "keys", "revoke", "bob", "--data-dir", dir); code != 0 {
		t.Fatalf("keys revoke bob: %s", stderr)
	}
	m, err := gateway.OpenMeter(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for _, e := range []gateway.MeterEvent{
		{KeyID: aliceID, TokensIn: 12, TokensOut: 64, DurationMS: 800, Outcome: gateway.OutcomeCompleted},
		{KeyID: aliceID, TokensIn: 10, TokensOut: 32, DurationMS: 400, Outcome: gateway.OutcomeCompleted, Verified: true},
		{KeyID: aliceID, TokensIn: 50, TokensOut: 500, DurationMS: 300, Outcome: gateway.OutcomeVerificationFailed, Verified: true},
		{KeyID: bobID, TokensIn: 3, TokensOut: 4, DurationMS: 100, Outcome: gateway.OutcomeCompleted},
		{KeyID: "key_ffffffff", TokensIn: 1, TokensOut: 1, DurationMS: 10, Outcome: "peer_lost"},
	} {
		e.Time, e.Model, e.Peer = t0, "synth-tiny", "12D3KooWpeer"
		if err := m.Record(e); err != nil {
			t.Fatal(err)
		}
	}
	return dir, aliceID, bobID
}

func TestUsageTotalsPerKey(t *testing.T) {
	dir, aliceID, bobID := writeUsage(t)
	code, stdout, stderr := runCmd(t, "usage", "--data-dir", dir)
	if code != 0 {
		t.Fatalf("usage: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	wantContains(t, "usage", stdout, "KEY", "NAME", "REQUESTS", "TOKENS IN", aliceID, "alice", bobID, "bob (revoked)",
		"key_ffffffff", "not in keys.json", "total")
	lines := strings.Split(stdout, "\n")
	row := func(prefix string) []string {
		for _, l := range lines {
			if strings.HasPrefix(l, prefix) {
				return strings.Fields(l)
			}
		}
		t.Fatalf("no row for %s:\n%s", prefix, stdout)
		return nil
	}
	// alice: 3 requests, 2 completed, 1 failed, 22 in, 96 out (the failed verification is
	// zero), 1.5s.
	if got, want := strings.Join(row(aliceID), " "), aliceID+" alice 3 2 1 22 96 1.5s"; got != want {
		t.Errorf("alice's row %q, want %q", got, want)
	}
	if got, want := strings.Join(row("total"), " "), "total 5 3 2 26 101 1.6s"; got != want {
		t.Errorf("total row %q, want %q", got, want)
	}
	if strings.Index(stdout, "alice") > strings.Index(stdout, "key_ffffffff") {
		t.Errorf("keys without a name come before named ones:\n%s", stdout)
	}

	code, stdout, _ = runCmd(t, "usage", "--data-dir", dir, "--json")
	var rep usageReport
	if code != 0 || json.Unmarshal([]byte(stdout), &rep) != nil {
		t.Fatalf("usage --json: exit %d, output:\n%s", code, stdout)
	}
	want := gateway.Usage{Requests: 3, Completed: 2, Failed: 1, TokensIn: 22, TokensOut: 96, Duration: 1500 * time.Millisecond}
	if len(rep.Keys) != 3 || rep.Keys[0].KeyID != aliceID || rep.Keys[0].Name != "alice" || rep.Keys[0].Usage != want ||
		!rep.Keys[1].Revoked || rep.Keys[2].Name != "" || rep.Total.Requests != 5 || rep.SkippedLines != 0 {
		t.Errorf("usage --json = %+v", rep)
	}
}

func TestUsageWithoutAny(t *testing.T) {
	dir := t.TempDir()
	code, stdout, stderr := runCmd(t, "usage", "--data-dir", dir)
	if code != 0 || !strings.Contains(stdout, "no usage recorded in "+dir) || stderr != "" {
		t.Errorf("usage of an empty dir: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	code, stdout, stderr = runCmd(t, "usage", "--data-dir", dir, "--json")
	var rep usageReport
	if code != 0 || json.Unmarshal([]byte(stdout), &rep) != nil || rep.Keys == nil || len(rep.Keys) != 0 ||
		!strings.Contains(stderr, "no usage recorded") {
		t.Errorf("usage --json of an empty dir: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	// A log that exists but holds nothing yet reads the same.
	m, err := gateway.OpenMeter(dir)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	if code, stdout, _ := runCmd(t, "usage", "--data-dir", dir); code != 0 || !strings.Contains(stdout, "no usage recorded") {
		t.Errorf("usage of an empty log: exit %d\n%s", code, stdout)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("usage wrote into the data dir: %v", entries)
	}
}

// A torn last line is reported and left out; the totals still show.
func TestUsageTornLine(t *testing.T) {
	dir, aliceID, _ := writeUsage(t)
	f, err := os.OpenFile(filepath.Join(dir, gateway.UsageFile), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"time":"2026-05-01T12:09:00Z","key_id":"` + aliceID + `","tok`)
	f.Close()

	code, stdout, stderr := runCmd(t, "usage", "--data-dir", dir)
	if code != 0 {
		t.Fatalf("usage with a torn line: exit %d\n%s", code, stderr)
	}
	wantContains(t, "stdout", stdout, aliceID, "total")
	wantContains(t, "stderr", stderr, "1 lines of", gateway.UsageFile, "[6]", "torn by a crash", "leave them out")
	code, stdout, _ = runCmd(t, "usage", "--data-dir", dir, "--json")
	var rep usageReport
	if code != 0 || json.Unmarshal([]byte(stdout), &rep) != nil || rep.SkippedLines != 1 || rep.Total.Requests != 5 {
		t.Errorf("usage --json with a torn line: exit %d\n%s", code, stdout)
	}
}

func TestUsageCommandErrors(t *testing.T) {
	dir, aliceID, _ := writeUsage(t)
	if code, _, stderr := runCmd(t, "usage", "--data-dir", dir, "extra"); code != 2 || !strings.Contains(stderr, `unexpected argument "extra"`) {
		t.Errorf("usage with a stray argument: exit %d\n%s", code, stderr)
	}
	if code, _, _ := runCmd(t, "usage", "--bogus"); code != 2 {
		t.Errorf("usage --bogus: exit %d, want 2", code)
	}
	// keys.json unreadable: the usage still shows, without names, and says why.
	if err := os.WriteFile(filepath.Join(dir, gateway.KeysFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCmd(t, "usage", "--data-dir", dir)
	if code != 0 || !strings.Contains(stdout, aliceID) || !strings.Contains(stderr, "key names not shown") {
		t.Errorf("usage with a broken keys.json: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}

// --receipts checks each event's receipt: a peer's receipt countersigned by the coordinator
// (the identity in the data dir) verifies, an event without one is counted apart, and an
// altered one fails the command, as does one countersigned by another key, even if it
// verifies.
func TestUsageReceipts(t *testing.T) {
	dir := t.TempDir()
	_, keyID := createKeyCmd(t, dir, "alice")
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	// served signs a task receipt with a new peer key, countersigned with coordKey.
	served := func(coordKey crypto.PrivKey) gateway.MeterEvent {
		peerKey, _, _ := crypto.GenerateEd25519Key(rand.Reader)
		peerID, _ := peer.IDFromPrivateKey(peerKey)
		coordID, _ := peer.IDFromPrivateKey(coordKey)
		rcpt, err := receipts.SignTask(peerKey, receipts.Receipt{Time: t0, Requester: coordID.String(), Model: "synth-tiny",
			TokensIn: 3, TokensOut: 8, DurationMS: 40, Outcome: receipts.Completed,
			Result: "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"})
		if err != nil {
			t.Fatal(err)
		}
		sig, err := receipts.Countersign(coordKey, rcpt)
		if err != nil {
			t.Fatal(err)
		}
		return gateway.MeterEvent{Peer: "peer:" + peerID.String(), TokensIn: 3, TokensOut: 8,
			Receipt: rcpt, Countersig: sig, Coordinator: coordID.String()}
	}
	write := func(events ...gateway.MeterEvent) {
		m, err := gateway.OpenMeter(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		for _, e := range events {
			e.Time, e.KeyID, e.Model, e.Outcome = t0, keyID, "synth-tiny", gateway.OutcomeCompleted
			if err := m.Record(e); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(gateway.MeterEvent{Peer: "local", TokensIn: 1, TokensOut: 2})
	code, stdout, stderr := runCmd(t, "usage", "--data-dir", dir, "--receipts")
	if code == 0 || !strings.Contains(stderr, "no identity key in "+dir) {
		t.Fatalf("usage --receipts with no identity in the data dir: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	coordKey, _, err := node.LoadOrCreateIdentity(dir) // as the coordinator's first start does
	if err != nil {
		t.Fatal(err)
	}
	good := served(coordKey)
	write(good)
	code, stdout, stderr = runCmd(t, "usage", "--data-dir", dir, "--receipts")
	if code != 0 || !strings.Contains(stdout, "receipts: 1 verified") || !strings.Contains(stdout, "1 tasks without one, 0 invalid\n") {
		t.Fatalf("usage --receipts: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	// Receipts that verify, of a peer and a coordinator both the forger's own keys.
	forgerKey, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	write(served(forgerKey), served(forgerKey))
	code, stdout, stderr = runCmd(t, "usage", "--data-dir", dir, "--receipts")
	if code == 0 || !strings.Contains(stdout, "0 invalid, 2 countersigned by another coordinator") ||
		!strings.Contains(stderr, "2 receipts in") || !strings.Contains(stderr, "another key than this node's identity") {
		t.Fatalf("usage --receipts with a forger's receipts: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	// A receipt claimed for another peer, one countersigned by someone else, and a line
	// billing more tokens than its receipt states (the counts are outside the signatures).
	other := good
	other.Peer = "peer:" + good.Coordinator
	forged := good
	forged.Coordinator = strings.TrimPrefix(good.Peer, "peer:")
	inflated := good
	inflated.TokensOut = 800
	write(other, forged, inflated)
	code, stdout, stderr = runCmd(t, "usage", "--data-dir", dir, "--receipts", "--json")
	var rep usageReport
	if code == 0 || json.Unmarshal([]byte(stdout), &rep) != nil || rep.Receipts == nil ||
		*rep.Receipts != (receiptCheck{Verified: 1, Missing: 1, Invalid: 3, OtherCoordinator: 2}) || !strings.Contains(stderr, "3 receipts") {
		t.Fatalf("usage --receipts --json with altered lines: exit %d, %+v\nstdout:\n%s\nstderr:\n%s", code, rep.Receipts, stdout, stderr)
	}
}

// --receipts checks a pipeline's event by its stage receipts: one of each stage, for its
// layers, countersigned by the coordinator, verifies; a stage without one leaves the task
// counted apart; a receipt for other layers or countersigned by someone else is invalid.
func TestUsageStageReceipts(t *testing.T) {
	dir := t.TempDir()
	_, keyID := createKeyCmd(t, dir, "alice")
	coordKey, _, err := node.LoadOrCreateIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	coordID, _ := peer.IDFromPrivateKey(coordKey)
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	var hops []inference.StageHop
	var parts []inference.StageReceipt
	for i, r := range [][2]int{{0, 2}, {2, 6}} {
		key, _, _ := crypto.GenerateEd25519Key(rand.Reader)
		id, _ := peer.IDFromPrivateKey(key)
		rcpt, err := receipts.SignStage(key, receipts.Receipt{Time: t0, Requester: coordID.String(), Model: "synth-small",
			DurationMS: 40, Outcome: receipts.Completed, Stage: &receipts.Stage{Lo: r[0], Hi: r[1], Steps: 3, Positions: 9,
				Session: strings.Repeat(fmt.Sprint(i), 32)}})
		if err != nil {
			t.Fatal(err)
		}
		sig, err := receipts.Countersign(coordKey, rcpt)
		if err != nil {
			t.Fatal(err)
		}
		hops = append(hops, inference.StageHop{Peer: id.String(), Lo: r[0], Hi: r[1]})
		parts = append(parts, inference.StageReceipt{Receipt: rcpt, Countersig: sig})
	}
	route := inference.Served{Tier: inference.TierMesh, Stages: hops}.Route()
	m, err := gateway.OpenMeter(dir)
	if err != nil {
		t.Fatal(err)
	}
	moved := slices.Clone(hops)
	moved[0].Hi, moved[1].Lo = 3, 3
	for _, e := range []gateway.MeterEvent{
		{Peer: route, StageReceipts: parts},
		{Peer: route, StageReceipts: parts[1:]},
		{Peer: inference.Served{Tier: inference.TierMesh, Stages: moved}.Route(), StageReceipts: parts},
		{Peer: route, StageReceipts: []inference.StageReceipt{parts[0], parts[0]}},
	} {
		e.Time, e.KeyID, e.Model, e.Outcome, e.Coordinator = t0, keyID, "synth-small", gateway.OutcomeCompleted, coordID.String()
		if err := m.Record(e); err != nil {
			t.Fatal(err)
		}
	}
	forged := gateway.MeterEvent{Time: t0, KeyID: keyID, Model: "synth-small", Outcome: gateway.OutcomeCompleted,
		Peer: route, StageReceipts: parts, Coordinator: hops[0].Peer}
	if err := m.Record(forged); err != nil {
		t.Fatal(err)
	}
	m.Close()
	code, stdout, stderr := runCmd(t, "usage", "--data-dir", dir, "--receipts", "--json")
	var rep usageReport
	if code == 0 || json.Unmarshal([]byte(stdout), &rep) != nil || rep.Receipts == nil ||
		*rep.Receipts != (receiptCheck{Verified: 1, Missing: 1, Invalid: 3}) {
		t.Fatalf("usage --receipts --json: exit %d, %+v\nstdout:\n%s\nstderr:\n%s", code, rep.Receipts, stdout, stderr)
	}
}

// --by-device splits each key's row by the device its requests named ("-": none); without
// it the rows are per key as before, with no device column or field.
func TestUsageByDevice(t *testing.T) {
	dir, aliceID, bobID := writeUsage(t)
	const laptop = "dev_0123456789abcdef0123456789abcdef"
	m, err := gateway.OpenMeter(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []gateway.MeterEvent{
		{KeyID: aliceID, Device: laptop, TokensIn: 5, TokensOut: 6, DurationMS: 200, Outcome: gateway.OutcomeCompleted},
		{KeyID: aliceID, Device: laptop, TokensIn: 1, TokensOut: 0, DurationMS: 100, Outcome: "peer_lost"},
	} {
		e.Time, e.Model = time.Date(2026, 5, 1, 13, 0, 0, 0, time.UTC), "synth-tiny"
		if err := m.Record(e); err != nil {
			t.Fatal(err)
		}
	}
	m.Close()

	code, stdout, stderr := runCmd(t, "usage", "--data-dir", dir, "--by-device")
	if code != 0 {
		t.Fatalf("usage --by-device: exit %d\n%s\n%s", code, stdout, stderr)
	}
	var rows []string
	for _, l := range strings.Split(stdout, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			rows = append(rows, strings.Join(f, " "))
		}
	}
	want := []string{
		"KEY NAME DEVICE REQUESTS COMPLETED FAILED TOKENS IN TOKENS OUT TIME",
		aliceID + " alice - 3 2 1 22 96 1.5s",
		aliceID + " alice " + laptop + " 2 1 1 6 6 300ms",
		bobID + " bob (revoked) - 1 1 0 3 4 100ms",
		"key_ffffffff - (not in keys.json) - 1 0 1 1 1 10ms",
		"total 7 4 3 32 107 1.9s",
	}
	if strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Errorf("usage --by-device:\n%s\nwant rows\n%s", stdout, strings.Join(want, "\n"))
	}

	code, stdout, _ = runCmd(t, "usage", "--data-dir", dir, "--by-device", "--json")
	var rep usageReport
	if code != 0 || json.Unmarshal([]byte(stdout), &rep) != nil || len(rep.Keys) != 4 {
		t.Fatalf("usage --by-device --json: exit %d\n%s", code, stdout)
	}
	if r := rep.Keys[1]; r.KeyID != aliceID || r.Device == nil || *r.Device != laptop || r.Requests != 2 ||
		rep.Keys[0].Device == nil || *rep.Keys[0].Device != "" || !strings.Contains(stdout, `"device": ""`) {
		t.Errorf("usage --by-device --json = %+v", rep)
	}

	code, stdout, _ = runCmd(t, "usage", "--data-dir", dir)
	if code != 0 || strings.Contains(stdout, "DEVICE") || strings.Contains(stdout, laptop) {
		t.Errorf("usage without --by-device shows devices:\n%s", stdout)
	}
	code, stdout, _ = runCmd(t, "usage", "--data-dir", dir, "--json")
	if code != 0 || strings.Contains(stdout, `"device"`) || json.Unmarshal([]byte(stdout), &rep) != nil || rep.Keys[0].Requests != 5 {
		t.Errorf("usage --json without --by-device:\n%s", stdout)
	}
}
