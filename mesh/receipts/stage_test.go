package receipts

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
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
