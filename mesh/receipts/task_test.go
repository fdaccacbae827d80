package receipts

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

const sampleResult = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

func taskReceipt(requester string) Receipt {
	r := receipt(requester, 0)
	r.Result = sampleResult
	return r
}

// A task receipt round-trips, and a coordinator's countersignature over it verifies for the
// coordinator only.
func TestTaskReceiptAndCountersig(t *testing.T) {
	key, server := newKey(t)
	coord, coordID := newKey(t)
	_, other := newKey(t)

	line, err := SignTask(key, taskReceipt(coordID))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(line, `"seq"`) || strings.HasSuffix(line, "\n") {
		t.Fatalf("task receipt has a seq or a newline: %s", line)
	}
	r, err := ParseTask(line)
	if err != nil {
		t.Fatal(err)
	}
	if r.Server != server || r.Result != sampleResult || r.Requester != coordID {
		t.Fatalf("parsed %+v", r)
	}
	sig, err := Countersign(coord, line)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := VerifyCountersig(coordID, line, sig); err != nil {
		t.Fatalf("countersignature does not verify: %v", err)
	}
	if _, err := VerifyCountersig(other, line, sig); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("countersignature claimed by another peer: %v, want ErrBadSignature", err)
	}
	// The countersignature covers the receipt byte for byte.
	tampered := strings.Replace(line, `"tokens_out":20`, `"tokens_out":21`, 1)
	if _, err := VerifyCountersig(coordID, tampered, sig); err == nil {
		t.Fatal("a tampered receipt verified")
	}
	if _, err := VerifyCountersig(coordID, line, sig[:len(sig)-4]+"AAA="); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("a wrong countersignature: %v, want ErrBadSignature", err)
	}
}

// A log line is not a task receipt (it has a seq), a receipt without a result is refused at
// signing, a forged or altered one fails, and an oversized one is refused unread.
func TestTaskReceiptRefusals(t *testing.T) {
	key, _ := newKey(t)
	_, requester := newKey(t)
	if _, err := SignTask(key, receipt(requester, 0)); !errors.Is(err, ErrNotTaskReceipt) {
		t.Fatalf("no result: %v, want ErrNotTaskReceipt", err)
	}
	bad := taskReceipt(requester)
	bad.Result = "sha256:XYZ"
	if _, err := SignTask(key, bad); err == nil {
		t.Fatal("a malformed result was signed")
	}

	dir := t.TempDir()
	l := openLog(t, dir, key)
	r := taskReceipt(requester)
	if err := l.Append(r); err != nil {
		t.Fatal(err)
	}
	logLine := lines(t, filepath.Join(dir, File))[0]
	if _, err := ParseTask(logLine); !errors.Is(err, ErrNotTaskReceipt) {
		t.Fatalf("a log line as a task receipt: %v, want ErrNotTaskReceipt", err)
	}

	line, err := SignTask(key, r)
	if err != nil {
		t.Fatal(err)
	}
	for name, forged := range map[string]string{
		"result changed": strings.Replace(line, sampleResult[:12], "sha256:00000", 1),
		"model changed":  strings.Replace(line, "synth-tiny", "synth-base", 1),
		"truncated":      line[:len(line)-10],
	} {
		if _, err := ParseTask(forged); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := ParseTask(strings.Repeat("x", MaxTaskReceipt+1)); !errors.Is(err, ErrTooLong) {
		t.Fatalf("oversized: %v, want ErrTooLong", err)
	}
}

// Old log lines (no result) still read: adding the optional field did not change their
// canonical form.
func TestLogLineWithResultReads(t *testing.T) {
	key, _ := newKey(t)
	_, requester := newKey(t)
	dir := t.TempDir()
	l := openLog(t, dir, key)
	if err := l.Append(receipt(requester, 0)); err != nil {
		t.Fatal(err)
	}
	if err := l.Append(taskReceipt(requester)); err != nil {
		t.Fatal(err)
	}
	res := readAll(t, filepath.Join(dir, File))
	if len(res.errs) != 0 || len(res.got) != 2 {
		t.Fatalf("read %d receipts, errors %v", len(res.got), res.errs)
	}
	if res.got[0].Result != "" || res.got[1].Result != sampleResult {
		t.Fatalf("results %q, %q", res.got[0].Result, res.got[1].Result)
	}
}
