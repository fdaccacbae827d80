package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"slices"
	"text/tabwriter"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/receipts"
	"github.com/meshinfer/meshinfer/transport/gateway"
)

// keyUsage is one row of `meshinfer usage`: a key and what it used, or with --by-device what
// one device of the key used.
type keyUsage struct {
	KeyID   string `json:"key_id"`
	Name    string `json:"name"` // "" when keys.json does not know the key
	Revoked bool   `json:"revoked"`
	// Device is, with --by-device, the device id the row's requests named ("" for those
	// that named none); absent without --by-device.
	Device *string `json:"device,omitempty"`
	gateway.Usage
}

// rowKey groups the meter's events into rows: by key, and with --by-device by device too.
type rowKey struct{ keyID, device string }

// usageReport is the JSON of `meshinfer usage --json`.
type usageReport struct {
	Keys         []keyUsage    `json:"keys"`
	Total        gateway.Usage `json:"total"`
	SkippedLines int           `json:"skipped_lines"`      // lines of usage.jsonl that could not be read
	Receipts     *receiptCheck `json:"receipts,omitempty"` // with --receipts
}

// receiptCheck is what `meshinfer usage --receipts` found in the meter's events.
type receiptCheck struct {
	// Verified events carry a task receipt signed by the serving peer named in the event,
	// countersigned by the coordinator; or, served by a pipeline, a stage receipt of each
	// of its stages, each signed by that stage for its layers and countersigned.
	Verified int `json:"verified"`
	// Missing events have no receipt: served by the coordinator itself or the cloud, or
	// failed before completing; or a pipeline some of whose stages gave none.
	Missing int `json:"missing"`
	// Invalid events carry a receipt or countersignature that does not verify, or a receipt
	// for another peer, layers, model or token counts than the event's: the line was
	// altered. The counts are the event's own and are what the totals add up; they are
	// outside what the peer and the coordinator signed, so a verified receipt must state
	// them too (the coordinator meters a task with a receipt only when they are equal; one
	// that failed verification is metered with none).
	Invalid int `json:"invalid"`
	// OtherCoordinator events carry receipts that verify, countersigned by another key
	// than the identity in the data dir: a log another node wrote, this node's from before
	// its identity changed, or lines forged with keys of the forger's own. Not verified.
	OtherCoordinator int `json:"other_coordinator"`
}

// checkReceipts checks the receipt of every event in the meter log at path; self is the
// coordinator's peer ID, whose countersignature a verified receipt bears.
func checkReceipts(path, self string) (*receiptCheck, error) {
	var c receiptCheck
	err := gateway.ReadEvents(path, func(e gateway.MeterEvent) {
		at, _ := inference.ParseRoute(e.Peer)
		var ok, covered bool
		if len(e.StageReceipts) > 0 {
			covered, ok = stageReceiptsHold(e, at)
		} else if covered = e.Receipt != ""; covered {
			r, err := receipts.VerifyCountersig(e.Coordinator, e.Receipt, e.Countersig)
			ok = err == nil && at.Tier == inference.TierMesh && at.Peer == r.Server && r.Model == e.Model &&
				(e.Outcome == gateway.OutcomeVerificationFailed || e.TokensIn == r.TokensIn && e.TokensOut == r.TokensOut)
		} else {
			ok = true
		}
		switch {
		case !ok:
			c.Invalid++
		case !covered:
			c.Missing++
		case e.Coordinator != self:
			c.OtherCoordinator++
		default:
			c.Verified++
		}
	})
	if _, partial := errors.AsType[*gateway.BadLinesError](err); err != nil && !partial {
		return nil, err
	}
	return &c, nil
}

// stageReceiptsHold checks a pipeline event's stage receipts: each countersigned by the
// coordinator, for the event's model, signed by a stage of its route for that stage's
// layers, one per stage at most. covered is whether every stage has one.
func stageReceiptsHold(e gateway.MeterEvent, at inference.Served) (covered, ok bool) {
	seen := make([]bool, len(at.Stages))
	for _, sr := range e.StageReceipts {
		r, err := receipts.VerifyStageCountersig(e.Coordinator, sr.Receipt, sr.Countersig)
		if err != nil || r.Model != e.Model {
			return false, false
		}
		i := slices.IndexFunc(at.Stages, func(h inference.StageHop) bool {
			return h.Peer == r.Server && h.Lo == r.Stage.Lo && h.Hi == r.Stage.Hi
		})
		if i < 0 || seen[i] {
			return false, false
		}
		seen[i] = true
	}
	return !slices.Contains(seen, false), true
}

func runUsage(args []string, stdout, stderr io.Writer) error {
	flags := newFlagSet("usage", "Total what each API key used through this coordinator (requests, tokens, time), from its\n"+
		"meter log, usage.jsonl in the data dir. Tasks that failed verification count no tokens.\n"+
		"--by-device splits each key's totals by the device id its clients sent (X-Meshinfer-Device).", stderr)
	dataDir := flags.String("data-dir", "", dataDirHelp)
	asJSON := flags.Bool("json", false, "print the totals as JSON, for scripts")
	byDevice := flags.Bool("by-device", false, "one row per device of each key (\"-\": requests that named no device)")
	checkRcpt := flags.Bool("receipts", false, "also check each task's receipt: signed by the serving peer over the\n"+
		"output's digest (a pipeline's: by each stage for its layers) and countersigned by this coordinator")
	if err := parse(flags, args, stdout); err != nil {
		return err
	}
	dir, err := dataDirOrDefault(*dataDir)
	if err != nil {
		return err
	}
	path := filepath.Join(dir, gateway.UsageFile)
	totals := map[rowKey]gateway.Usage{}
	err = gateway.ReadEvents(path, func(e gateway.MeterEvent) {
		k := rowKey{keyID: e.KeyID}
		if *byDevice {
			k.device = e.Device
		}
		u := totals[k]
		u.Add(e)
		totals[k] = u
	})
	bad, partial := errors.AsType[*gateway.BadLinesError](err)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		totals = nil
	case err != nil && !partial:
		return err
	}

	report := usageReport{Keys: []keyUsage{}}
	if partial {
		report.SkippedLines = bad.Count
	}
	if len(totals) > 0 {
		report.Keys = usageRows(dir, totals, *byDevice, stderr)
		for _, r := range report.Keys {
			report.Total.Requests += r.Requests
			report.Total.Completed += r.Completed
			report.Total.Failed += r.Failed
			report.Total.TokensIn += r.TokensIn
			report.Total.TokensOut += r.TokensOut
			report.Total.Duration += r.Duration
		}
	}
	var self string // this coordinator's peer ID, with --receipts
	if *checkRcpt && len(totals) > 0 {
		if self, err = ownID(dir); err != nil {
			return err
		}
		if self == "" {
			return fmt.Errorf("no identity key in %s to check the receipts against: they are countersigned by the coordinator's key, which lives in its data dir; pass that --data-dir", dir)
		}
		if report.Receipts, err = checkReceipts(path, self); err != nil {
			return err
		}
	}
	if partial { // after the totals, where it is seen
		defer fmt.Fprintf(stderr, "meshinfer usage: %d lines of %s could not be read (first at lines %v): torn by a crash mid-write, or altered; the totals leave them out\n",
			bad.Count, path, bad.Lines)
	}

	if *asJSON {
		if len(report.Keys) == 0 {
			fmt.Fprintf(stderr, "no usage recorded in %s: no request has been served through this coordinator yet\n", dir)
		}
		if err := printJSON(stdout, report); err != nil {
			return err
		}
		return report.Receipts.failure(path, self)
	}
	if len(report.Keys) == 0 {
		fmt.Fprintf(stdout, "no usage recorded in %s: no request has been served through this coordinator yet\n", dir)
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	deviceCol, pad := "", "" // the DEVICE column, with --by-device
	if *byDevice {
		deviceCol, pad = "DEVICE\t", "\t"
	}
	fmt.Fprintln(tw, "KEY\tNAME\t"+deviceCol+"REQUESTS\tCOMPLETED\tFAILED\tTOKENS IN\tTOKENS OUT\tTIME")
	for _, r := range report.Keys {
		name := r.Name
		switch {
		case name == "":
			name = "- (not in keys.json)"
		case r.Revoked:
			name += " (revoked)"
		}
		if r.Device != nil { // the DEVICE column
			name += "\t" + cmp.Or(*r.Device, "-")
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", r.KeyID, name, r.Requests, r.Completed, r.Failed,
			r.TokensIn, r.TokensOut, roundDuration(r.Duration))
	}
	t := report.Total
	fmt.Fprintf(tw, "total\t\t"+pad+"%d\t%d\t%d\t%d\t%d\t%s\n", t.Requests, t.Completed, t.Failed, t.TokensIn, t.TokensOut, roundDuration(t.Duration))
	if err := tw.Flush(); err != nil {
		return err
	}
	if c := report.Receipts; c != nil {
		fmt.Fprintf(stdout, "\nreceipts: %d verified (signed by the serving peer, countersigned by this coordinator), %d tasks without one, %d invalid",
			c.Verified, c.Missing, c.Invalid)
		if c.OtherCoordinator > 0 {
			fmt.Fprintf(stdout, ", %d countersigned by another coordinator", c.OtherCoordinator)
		}
		fmt.Fprintln(stdout)
	}
	return report.Receipts.failure(path, self)
}

// failure is the command's error when c (nil: receipts not checked) found receipts that do
// not hold in the meter log at path; self is this coordinator's peer ID.
func (c *receiptCheck) failure(path, self string) error {
	switch {
	case c == nil:
		return nil
	case c.Invalid > 0:
		return fmt.Errorf("%d receipts in %s do not verify: those lines were altered", c.Invalid, path)
	case c.OtherCoordinator > 0:
		return fmt.Errorf("%d receipts in %s are countersigned by another key than this node's identity (%s): a log another node wrote, this node's from before its identity changed, or forged lines",
			c.OtherCoordinator, path, self)
	}
	return nil
}

// usageRows joins the totals with the key names of keys.json, sorted by name, then id (keys
// keys.json does not know last), then device; rows carry their device when byDevice. A
// keys.json that cannot be read leaves the names out, with a warning: the usage is still
// worth showing.
func usageRows(dir string, totals map[rowKey]gateway.Usage, byDevice bool, stderr io.Writer) []keyUsage {
	known := map[string]gateway.Key{}
	if ks, err := gateway.OpenKeys(dir); err != nil {
		fmt.Fprintf(stderr, "meshinfer usage: key names not shown: %v\n", err)
	} else {
		for _, k := range ks.List() {
			known[k.ID] = k
		}
	}
	rows := make([]keyUsage, 0, len(totals))
	for rk, u := range totals {
		k := known[rk.keyID]
		row := keyUsage{KeyID: rk.keyID, Name: k.Name, Revoked: k.Revoked(), Usage: u}
		if byDevice {
			row.Device = &rk.device
		}
		rows = append(rows, row)
	}
	slices.SortFunc(rows, func(a, b keyUsage) int {
		if (a.Name == "") != (b.Name == "") {
			return cmp.Compare(b.Name, a.Name) // named first
		}
		var ad, bd string
		if a.Device != nil && b.Device != nil {
			ad, bd = *a.Device, *b.Device
		}
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.KeyID, b.KeyID), cmp.Compare(ad, bd))
	})
	return rows
}
