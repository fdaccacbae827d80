package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/mesh/receipts"
	"github.com/meshinfer/meshinfer/node"
)

// maxListedErrors bounds how many failed lines receipts prints; the count covers them all.
const maxListedErrors = 20

func runReceipts(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("receipts", "List and total the tasks this node served for other peers, from its signed receipts\n"+
		"log, verifying every line. Exits 1 if any line fails verification.", stderr)
	dataDir := fs.String("data-dir", "", "the node's data dir, where receipts.jsonl lives (default $XDG_DATA_HOME/meshinfer, else ~/.local/share/meshinfer)")
	asJSON := fs.Bool("json", false, "print the totals as JSON, for scripts")
	verifyOnly := fs.Bool("verify-only", false, "only verify the log and print how many receipts verify")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if *asJSON && *verifyOnly {
		fmt.Fprintln(stderr, "meshinfer receipts: --json and --verify-only do not go together")
		return errUsage
	}
	dir := *dataDir
	if dir == "" {
		var err error
		if dir, err = node.DefaultDataDir(); err != nil {
			return err
		}
	}
	path := filepath.Join(dir, receipts.File)
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		if *asJSON {
			fmt.Fprintf(stderr, "no receipts in %s: this node has served nothing for other peers yet\n", dir)
			return printJSON(stdout, receipts.Totals{ByModel: map[string]receipts.Tally{}, ByRequester: map[string]receipts.Tally{}})
		}
		fmt.Fprintf(stdout, "no receipts in %s: this node has served nothing for other peers yet\n", dir)
		return nil
	}
	self, err := ownID(dir)
	if err != nil {
		return err
	}

	// One pass: rows go to the table as they are read, failures are kept for the end.
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	if !*asJSON && !*verifyOnly {
		fmt.Fprintln(tw, "TIME\tREQUESTER\tMODEL\tIN\tOUT\tDURATION\tOUTCOME")
	}
	totals := receipts.Totals{ByModel: map[string]receipts.Tally{}, ByRequester: map[string]receipts.Tally{}}
	var failed []error
	err = receipts.Read(path, func(r receipts.Receipt, err error) bool {
		if err == nil && self != "" && r.Server != self {
			err = fmt.Errorf("seq %d is signed by %s, not by this node (%s)", r.Seq, r.Server, self)
		}
		if err != nil {
			failed = append(failed, err)
			return true
		}
		totals.Add(r)
		if !*asJSON && !*verifyOnly {
			model := r.Label() // a pipeline stage's part: the model and its layers, "synth-large[0-7]"
			if r.Model == "" {
				model = "-" // the requester let the router choose
			}
			in, out := strconv.Itoa(r.TokensIn), strconv.Itoa(r.TokensOut)
			if r.Stage != nil {
				// A stage sees hidden states, not tokens: the positions it ran, in steps.
				in, out = fmt.Sprintf("%d pos", r.Stage.Positions), fmt.Sprintf("%d steps", r.Stage.Steps)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Time.Local().Format(time.DateTime), shortID(r.Requester),
				model, in, out, roundDuration(time.Duration(r.DurationMS)*time.Millisecond), r.Outcome)
		}
		return true
	})
	if err != nil {
		return err
	}

	switch {
	case *asJSON:
		if err := printJSON(stdout, totals); err != nil {
			return err
		}
	case *verifyOnly:
		fmt.Fprintf(stdout, "%d receipts verify in %s\n", totals.Tasks, path)
	default:
		if totals.Tasks > 0 {
			tw.Flush()
			fmt.Fprintln(stdout)
		}
		renderTotals(stdout, totals)
	}
	if len(failed) == 0 {
		return nil
	}
	for i, e := range failed {
		if i == maxListedErrors {
			fmt.Fprintf(stderr, "  … and %d more\n", len(failed)-i)
			break
		}
		fmt.Fprintf(stderr, "  %v\n", e)
	}
	return fmt.Errorf("%d lines of %s failed verification: the log was altered, or torn by a crash mid-write; the totals leave them out", len(failed), path)
}

// ownID returns the peer ID of the identity in dir, or "" when dir has none: receipts of a
// log copied elsewhere are then checked against the server they name only.
func ownID(dir string) (string, error) {
	key, err := node.LoadIdentity(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return "", err
	}
	return id.String(), nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func renderTotals(w io.Writer, t receipts.Totals) {
	if t.Tasks == 0 {
		fmt.Fprintln(w, "no receipt verifies: nothing served for others can be shown")
		return
	}
	fmt.Fprintf(w, "served for others  %d tasks: %d completed, %d failed, from %s to %s\n", t.Tasks, t.Completed, t.Failed,
		t.First.Local().Format(time.DateTime), t.Last.Local().Format(time.DateTime))
	fmt.Fprintf(w, "tokens             %d in, %d out\n", t.TokensIn, t.TokensOut)
	if t.Stages > 0 {
		fmt.Fprintf(w, "pipeline stages    %d of those tasks: %d positions in %d steps through layer ranges\n", t.Stages, t.Positions, t.Steps)
	}
	fmt.Fprintf(w, "time               %s\n", roundDuration(t.Duration))
	fmt.Fprintln(w, "by model")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, m := range slices.Sorted(maps.Keys(t.ByModel)) {
		s := t.ByModel[m]
		if s.Steps > 0 || s.Positions > 0 {
			fmt.Fprintf(tw, "  %s\t%d tasks\t%d completed\t%d pos\t%d steps\t%s\n", m, s.Tasks, s.Completed, s.Positions, s.Steps, roundDuration(s.Duration))
			continue
		}
		fmt.Fprintf(tw, "  %s\t%d tasks\t%d completed\t%d in\t%d out\t%s\n", m, s.Tasks, s.Completed, s.TokensIn, s.TokensOut, roundDuration(s.Duration))
	}
	tw.Flush()
}

// roundDuration keeps durations readable: milliseconds under a second, then tenths.
func roundDuration(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}
