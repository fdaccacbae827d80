package receipts

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/meshinfer/meshinfer/internal/jsonlog"
)

// Read streams the log at path line by line, calling fn with each verified receipt (and a nil
// error) or with the *LineError of a line that failed (and a zero Receipt), until the end of
// the file or until fn returns false. Empty lines are skipped. A line of MaxLineSize bytes or
// more is reported as ErrTooLong without being held in memory. When receipts are missing
// before a line, fn gets the ErrSequence error for that line first, then the line's receipt.
//
// The error is about the file itself (it cannot be opened or read); a missing file gives an
// error that matches fs.ErrNotExist.
func Read(path string, fn func(Receipt, error) bool) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("read receipts: %w", err)
	}
	defer f.Close()
	if err := read(f, fn); err != nil {
		return fmt.Errorf("read receipts: %w", err)
	}
	return nil
}

func read(rd io.Reader, fn func(Receipt, error) bool) error {
	var sc scanState
	return jsonlog.Scan(rd, MaxLineSize, func(n int, line []byte, err error) bool {
		if err != nil { // jsonlog.ErrTooLong, the only error it passes
			sc.bad++
			return fn(Receipt{}, &LineError{Line: n, Err: ErrTooLong})
		}
		return sc.deliver(n, line, fn)
	})
}

// scanState follows the numbering through a log.
type scanState struct {
	v    verifier
	last uint64 // seq of the last receipt delivered
	bad  uint64 // lines reported since: each may have held one of the seqs skipped
}

// deliver parses line n and calls fn for it; it reports whether to go on.
func (sc *scanState) deliver(n int, line []byte, fn func(Receipt, error) bool) bool {
	r, err := sc.v.parse(line)
	switch {
	case err != nil:
		sc.bad++
		return fn(Receipt{}, &LineError{Line: n, Err: err})
	case r.Seq <= sc.last:
		sc.bad++
		return fn(Receipt{}, &LineError{Line: n, Err: fmt.Errorf("%w: seq %d repeats or precedes %d", ErrSequence, r.Seq, sc.last)})
	case r.Seq-sc.last-1 > sc.bad:
		// More seqs skipped than lines reported in between: lines were removed. (A torn
		// line skips none: the next Append reuses its seq.)
		missing := r.Seq - sc.last - 1 - sc.bad
		gap := fmt.Errorf("%w: seq %d follows %d: %d receipts missing before this line", ErrSequence, r.Seq, sc.last, missing)
		if !fn(Receipt{}, &LineError{Line: n, Err: gap}) {
			return false
		}
	}
	sc.last, sc.bad = r.Seq, 0
	return fn(r, nil)
}

// Tally sums a set of receipts. Steps and Positions sum the stage parts among them
// (Receipt.Stage).
type Tally struct {
	Tasks     int           `json:"tasks"`
	Completed int           `json:"completed"`
	TokensIn  int64         `json:"tokens_in"`
	TokensOut int64         `json:"tokens_out"`
	Duration  time.Duration `json:"duration_ns"`
	Steps     int64         `json:"stage_steps,omitempty"`
	Positions int64         `json:"stage_positions,omitempty"`
}

func (t *Tally) add(r Receipt) {
	t.Tasks++
	if r.Outcome == Completed {
		t.Completed++
	}
	t.TokensIn += int64(r.TokensIn)
	t.TokensOut += int64(r.TokensOut)
	t.Duration += time.Duration(r.DurationMS) * time.Millisecond
	if r.Stage != nil {
		t.Steps += int64(r.Stage.Steps)
		t.Positions += int64(r.Stage.Positions)
	}
}

// Totals sums a log. Failed counts every outcome but Completed. Stages counts the tasks
// that were a pipeline stage's part (counted in Tasks too, with their steps and positions
// in Steps and Positions); ByModel has them under their Label ("synth-large[0-7]").
type Totals struct {
	Tasks       int              `json:"tasks"`
	Completed   int              `json:"completed"`
	Failed      int              `json:"failed"`
	TokensIn    int64            `json:"tokens_in"`
	TokensOut   int64            `json:"tokens_out"`
	Duration    time.Duration    `json:"duration_ns"`
	Stages      int              `json:"stages,omitempty"`
	Steps       int64            `json:"stage_steps,omitempty"`
	Positions   int64            `json:"stage_positions,omitempty"`
	First       time.Time        `json:"first,omitzero"` // time of the earliest receipt
	Last        time.Time        `json:"last,omitzero"`  // time of the latest receipt
	ByModel     map[string]Tally `json:"by_model"`
	ByRequester map[string]Tally `json:"by_requester"` // by requester peer ID
}

// Add counts r.
func (t *Totals) Add(r Receipt) {
	if t.ByModel == nil {
		t.ByModel = make(map[string]Tally)
	}
	if t.ByRequester == nil {
		t.ByRequester = make(map[string]Tally)
	}
	t.Tasks++
	if r.Outcome == Completed {
		t.Completed++
	} else {
		t.Failed++
	}
	t.TokensIn += int64(r.TokensIn)
	t.TokensOut += int64(r.TokensOut)
	t.Duration += time.Duration(r.DurationMS) * time.Millisecond
	if r.Stage != nil {
		t.Stages++
		t.Steps += int64(r.Stage.Steps)
		t.Positions += int64(r.Stage.Positions)
	}
	if t.First.IsZero() || r.Time.Before(t.First) {
		t.First = r.Time
	}
	if r.Time.After(t.Last) {
		t.Last = r.Time
	}
	label := r.Label()
	m := t.ByModel[label]
	m.add(r)
	t.ByModel[label] = m
	q := t.ByRequester[r.Requester]
	q.add(r)
	t.ByRequester[r.Requester] = q
}

// Total reads the log at path and sums its verified receipts. errs lists the lines that failed
// (each a *LineError); err is about the file itself, as for Read.
func Total(path string) (t Totals, errs []error, err error) {
	t = Totals{ByModel: map[string]Tally{}, ByRequester: map[string]Tally{}}
	err = Read(path, func(r Receipt, lerr error) bool {
		if lerr != nil {
			errs = append(errs, lerr)
		} else {
			t.Add(r)
		}
		return true
	})
	return t, errs, err
}
