package receipts

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// oldLine was written by this package before receipts had a stage member (commit b3f7e6e),
// with the ed25519 key of seed 0x00, 0x01, …, 0x1f: receipts already in logs keep
// verifying, and verify to the same receipt.
const oldLine = `{"time":"2026-05-01T12:00:03.25Z","requester":"12D3KooWRBy97UB99e3J6hiPesre1MZeuNQvfan4gBziswrRJsNK",` +
	`"model":"synth-tiny","tokens_in":12,"tokens_out":64,"duration_ms":840,"outcome":"completed",` +
	`"result":"sha256:0000000000000000000000000000000000000000000000000000000000000007",` +
	`"server":"12D3KooWA4Xop1JaT3MHxwYMkCepYsv4iPVopMXwCz5iHYdBfeSB","seq":1,` +
	`"sig":"ed25519:psMIoj/5sxOk/PLInwQFW6bjryPogpWW4k2UWm7QUTqp2TUChZ8HneZcZmmagdtdKSgJBJnNDeRBrxQGIT2mBg=="}`

func TestAReceiptWrittenBeforeStagesVerifies(t *testing.T) {
	path := filepath.Join(t.TempDir(), File)
	writeLines(t, path, []string{oldLine})
	res := readAll(t, path)
	if len(res.errs) != 0 || len(res.got) != 1 {
		t.Fatalf("read %d receipts, errors %v; want the old line verified", len(res.got), res.errs)
	}
	r := res.got[0]
	if r.Stage != nil || r.Model != "synth-tiny" || r.TokensOut != 64 || r.Seq != 1 || r.Label() != "synth-tiny" {
		t.Fatalf("old line read as %+v", r)
	}
}

// A stage's receipt carries its layer range and counts, in the signed bytes: each is
// checked like any field, and removing or adding the member breaks the signature.
func TestStageReceipts(t *testing.T) {
	dir := t.TempDir()
	key, _ := newKey(t)
	_, head := newKey(t)
	l := openLog(t, dir, key)
	part := Receipt{Time: t0, Requester: head, Model: "synth-large", DurationMS: 420, Outcome: Completed,
		Stage: &Stage{Lo: 0, Hi: 8, Steps: 9, Positions: 20}}
	if err := l.Append(part); err != nil {
		t.Fatal(err)
	}
	whole := receipt(head, 1)
	if err := l.Append(whole); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, File)
	res := readAll(t, path)
	if len(res.errs) != 0 || len(res.got) != 2 {
		t.Fatalf("read %d receipts, errors %v", len(res.got), res.errs)
	}
	if got := res.got[0]; got.Stage == nil || *got.Stage != *part.Stage || got.Label() != "synth-large[0-7]" || got.Requester != head {
		t.Fatalf("stage receipt read as %+v (stage %+v)", got, got.Stage)
	}
	if got := res.got[1]; got.Stage != nil || got.Label() != "synth-small" {
		t.Fatalf("plain receipt read as %+v", got)
	}
	ls := lines(t, path)
	const member = `"stage":{"lo":0,"hi":8,"steps":9,"positions":20}`
	if !strings.Contains(ls[0], `"model":"synth-large",`+member+`,"tokens_in":0`) {
		t.Fatalf("stage line %s: want %s after model", ls[0], member)
	}
	if strings.Contains(ls[1], `"stage"`) {
		t.Fatalf("plain line %s has a stage member", ls[1])
	}

	tests := []struct {
		name string
		line string
		want error
	}{
		{"hi moved", strings.Replace(ls[0], `"hi":8`, `"hi":9`, 1), ErrBadSignature},
		{"lo moved", strings.Replace(ls[0], `"lo":0`, `"lo":1`, 1), ErrBadSignature},
		{"steps raised", strings.Replace(ls[0], `"steps":9`, `"steps":90`, 1), ErrBadSignature},
		{"positions raised", strings.Replace(ls[0], `"positions":20`, `"positions":200`, 1), ErrBadSignature},
		{"stage removed", strings.Replace(ls[0], member+",", "", 1), ErrBadSignature},
		{"stage added", strings.Replace(ls[1], `"tokens_in"`, member+`,"tokens_in"`, 1), ErrBadSignature},
		{"empty range", strings.Replace(ls[0], `"hi":8`, `"hi":0`, 1), ErrMalformed},
		{"unknown stage field", strings.Replace(ls[0], `"lo":0`, `"lo":0,"peer":"x"`, 1), ErrMalformed},
		{"stage members reordered", strings.Replace(ls[0], `"lo":0,"hi":8`, `"hi":8,"lo":0`, 1), ErrMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.line == ls[0] || tc.line == ls[1] {
				t.Fatal("the test did not change the line")
			}
			p := filepath.Join(t.TempDir(), File)
			writeLines(t, p, []string{tc.line})
			res := readAll(t, p)
			if len(res.got) != 0 || len(res.errs) != 1 || !errors.Is(res.errs[0], tc.want) {
				t.Fatalf("read %d receipts and %v, want one %v", len(res.got), res.errs, tc.want)
			}
		})
	}

	for name, st := range map[string]Stage{
		"empty range":        {Lo: 3, Hi: 3},
		"negative lo":        {Lo: -1, Hi: 2},
		"negative steps":     {Lo: 0, Hi: 2, Steps: -1},
		"negative positions": {Lo: 0, Hi: 2, Positions: -1},
	} {
		r := part
		r.Stage = &st
		if err := l.Append(r); err == nil {
			t.Errorf("%s: appended", name)
		}
	}
}

func TestTotalsOfStageParts(t *testing.T) {
	var tot Totals
	tot.Add(Receipt{Requester: "h", Model: "synth-large", Outcome: Completed, DurationMS: 100, Stage: &Stage{Lo: 0, Hi: 8, Steps: 9, Positions: 20}})
	tot.Add(Receipt{Requester: "h", Model: "synth-large", Outcome: "timeout", DurationMS: 50, Stage: &Stage{Lo: 0, Hi: 8, Steps: 2, Positions: 11}})
	tot.Add(Receipt{Requester: "h", Model: "synth-large", Outcome: Completed, Stage: &Stage{Lo: 8, Hi: 16, Steps: 1, Positions: 10}})
	tot.Add(Receipt{Requester: "h", Model: "synth-tiny", Outcome: Completed, TokensIn: 3, TokensOut: 5})
	if tot.Tasks != 4 || tot.Stages != 3 || tot.Steps != 12 || tot.Positions != 41 || tot.TokensOut != 5 || tot.Failed != 1 {
		t.Fatalf("totals %+v", tot)
	}
	if a := tot.ByModel["synth-large[0-7]"]; a.Tasks != 2 || a.Completed != 1 || a.Steps != 11 || a.Positions != 31 {
		t.Fatalf("synth-large[0-7] %+v", a)
	}
	if b, w := tot.ByModel["synth-large[8-15]"], tot.ByModel["synth-tiny"]; b.Tasks != 1 || w.Tasks != 1 || w.Steps != 0 || len(tot.ByModel) != 3 {
		t.Fatalf("by model %+v", tot.ByModel)
	}
}

const sampleSession = "5f0c2a9e41b7d3806e1f2c4a9b8d7e60"

// stagePart is a stage's receipt of its part of a session headed by head.
func stagePart(head string) Receipt {
	return Receipt{Time: t0, Requester: head, Model: "synth-large", DurationMS: 420, Outcome: Completed,
		Stage: &Stage{Lo: 8, Hi: 16, Steps: 9, Positions: 20, Session: sampleSession}}
}

// A stage receipt round-trips, the head's check accepts exactly what it ran, and its
// countersignature verifies for the head only, as a stage receipt only.
func TestStageReceiptAndCountersig(t *testing.T) {
	key, server := newKey(t)
	headKey, head := newKey(t)
	_, other := newKey(t)
	line, err := SignStage(key, stagePart(head))
	if err != nil {
		t.Fatal(err)
	}
	const member = `"stage":{"lo":8,"hi":16,"steps":9,"positions":20,"session":"` + sampleSession + `"}`
	if strings.Contains(line, `"seq"`) || strings.Contains(line, `"result"`) || !strings.Contains(line, member) {
		t.Fatalf("stage receipt %s: want %s, no seq, no result", line, member)
	}
	want := stagePart(head)
	want.Server = server
	r, err := CheckStage(line, want)
	if err != nil {
		t.Fatal(err)
	}
	if r.Server != server || r.Requester != head || *r.Stage != *want.Stage || !r.Time.Equal(t0) || r.DurationMS != 420 {
		t.Fatalf("checked %+v (stage %+v)", r, r.Stage)
	}
	// Time and duration are the stage's to say.
	later := want
	later.Time, later.DurationMS = t0.Add(time.Hour), 1
	if _, err := CheckStage(line, later); err != nil {
		t.Fatalf("another time and duration: %v", err)
	}

	sig, err := Countersign(headKey, line)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := VerifyStageCountersig(head, line, sig); err != nil || r.Stage.Session != sampleSession {
		t.Fatalf("countersignature: %+v, %v", r, err)
	}
	if _, err := VerifyStageCountersig(other, line, sig); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("countersignature claimed by another peer: %v, want ErrBadSignature", err)
	}
	if _, err := VerifyCountersig(head, line, sig); !errors.Is(err, ErrNotTaskReceipt) {
		t.Fatalf("a stage receipt's countersignature as a task's: %v, want ErrNotTaskReceipt", err)
	}
	tampered := strings.Replace(line, `"steps":9`, `"steps":90`, 1)
	if _, err := VerifyStageCountersig(head, tampered, sig); err == nil {
		t.Fatal("a tampered stage receipt verified")
	}

	// Each field the head knows must be what it ran.
	for name, change := range map[string]func(*Receipt){
		"server":    func(r *Receipt) { r.Server = other },
		"requester": func(r *Receipt) { r.Requester = other },
		"model":     func(r *Receipt) { r.Model = "synth-base" },
		"outcome":   func(r *Receipt) { r.Outcome = "timeout" },
		"lo":        func(r *Receipt) { r.Stage.Lo = 7 },
		"hi":        func(r *Receipt) { r.Stage.Hi = 17 },
		"steps":     func(r *Receipt) { r.Stage.Steps = 10 },
		"positions": func(r *Receipt) { r.Stage.Positions = 21 },
		"session":   func(r *Receipt) { r.Stage.Session = strings.Repeat("0", 32) },
		"no stage":  func(r *Receipt) { r.Stage = nil },
	} {
		w := want
		st := *want.Stage
		w.Stage = &st
		change(&w)
		if _, err := CheckStage(line, w); !errors.Is(err, ErrMismatch) {
			t.Errorf("%s differs: %v, want ErrMismatch", name, err)
		}
	}
}

// Only a stage receipt is one: a task receipt, a log line, a receipt with tokens or a
// result are refused, at signing and at parsing; a forged one fails its signature.
func TestStageReceiptRefusals(t *testing.T) {
	key, _ := newKey(t)
	_, head := newKey(t)
	for name, change := range map[string]func(*Receipt){
		"no stage":    func(r *Receipt) { r.Stage = nil },
		"a result":    func(r *Receipt) { r.Result = sampleResult },
		"tokens in":   func(r *Receipt) { r.TokensIn = 1 },
		"tokens out":  func(r *Receipt) { r.TokensOut = 1 },
		"bad session": func(r *Receipt) { r.Stage.Session = strings.ToUpper(sampleSession) },
		"short":       func(r *Receipt) { r.Stage.Session = sampleSession[:30] },
	} {
		r := stagePart(head)
		change(&r)
		if _, err := SignStage(key, r); err == nil {
			t.Errorf("%s: signed", name)
		}
	}
	if _, err := SignTask(key, stagePart(head)); !errors.Is(err, ErrNotTaskReceipt) {
		t.Fatalf("a stage's part as a task receipt: %v, want ErrNotTaskReceipt", err)
	}

	line, err := SignStage(key, stagePart(head))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseTask(line); !errors.Is(err, ErrNotTaskReceipt) {
		t.Fatalf("a stage receipt as a task receipt: %v, want ErrNotTaskReceipt", err)
	}
	task, err := SignTask(key, taskReceipt(head))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseStage(task); !errors.Is(err, ErrNotStageReceipt) {
		t.Fatalf("a task receipt as a stage receipt: %v, want ErrNotStageReceipt", err)
	}
	dir := t.TempDir()
	l := openLog(t, dir, key)
	if err := l.Append(stagePart(head)); err != nil {
		t.Fatal(err)
	}
	logLine := lines(t, filepath.Join(dir, File))[0]
	if _, err := ParseStage(logLine); !errors.Is(err, ErrNotStageReceipt) {
		t.Fatalf("a log line as a stage receipt: %v, want ErrNotStageReceipt", err)
	}
	if res := readAll(t, filepath.Join(dir, File)); len(res.got) != 1 || res.got[0].Stage.Session != sampleSession {
		t.Fatalf("the log line read as %+v (%v)", res.got, res.errs)
	}
	for name, forged := range map[string]string{
		"session changed":  strings.Replace(line, sampleSession[:8], "00000000", 1),
		"positions raised": strings.Replace(line, `"positions":20`, `"positions":21`, 1),
		"truncated":        line[:len(line)-10],
	} {
		if forged == line {
			t.Fatalf("%s: the test did not change the line", name)
		}
		if _, err := ParseStage(forged); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := ParseStage(strings.Repeat("x", MaxTaskReceipt+1)); !errors.Is(err, ErrTooLong) {
		t.Fatalf("oversized: %v, want ErrTooLong", err)
	}
}
