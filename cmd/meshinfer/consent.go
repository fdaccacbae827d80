package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/mesh/participation"
	"github.com/meshinfer/meshinfer/node"
)

const consentSynopsis = `Give, show or withdraw this machine owner's consent. Nothing is contributed to the mesh
before the owner agrees; withdrawing takes effect at once, also for a running node.

  meshinfer consent                       ask, in this terminal
  meshinfer consent --contribute yes --run-local yes --cloud no --battery-floor 30 --pause-on-metered yes
  meshinfer consent --contribute yes --require-charging yes --max-bytes-per-hour 500MB --max-memory-share 25
  meshinfer consent --show
  meshinfer consent --withdraw

With any of --run-local, --contribute, --cloud or the limits (--battery-floor,
--pause-on-metered, --require-charging, --thermal-max-state, --max-tasks-per-min,
--max-bytes-per-hour, --max-memory-share) the consent is recorded without asking (for scripts); choices not
given are "no", the battery floor keeps 30 %, pausing on metered connections yes, and the
other limits none. The limits only tighten the deployer's profile, never loosen it.

--consent-text FILE shows the deployer's wording instead of the built-in one; the record
keeps its SHA-256, and a node started with other wording asks again.`

func runConsent(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("consent", consentSynopsis, stderr)
	dataDir := fs.String("data-dir", "", "where the consent is stored (default $XDG_DATA_HOME/meshinfer, else ~/.local/share/meshinfer)")
	withdraw := fs.Bool("withdraw", false, "withdraw consent: stop contributing and using the cloud at once")
	show := fs.Bool("show", false, "print the recorded consent")
	textFile := fs.String("consent-text", "", "file with the deployer's consent wording, shown instead of the built-in one (plain text, at most 64 KiB); give the node the same file")
	runLocal := fs.String("run-local", "", "yes or no: run models locally on this machine")
	contribute := fs.String("contribute", "", "yes or no: serve other people's requests from the mesh")
	cloud := fs.String("cloud", "", "yes or no: allow sending requests to a cloud API when this machine and the mesh cannot serve")
	floor := fs.Int("battery-floor", participation.DefaultBatteryFloor, "battery level in percent below which this machine stops contributing")
	metered := fs.String("pause-on-metered", "yes", "yes or no: stop contributing on a metered (cellular) connection")
	charging := fs.String("require-charging", "no", "yes or no: contribute only while charging (or on mains)")
	thermal := fs.String("thermal-max-state", caps.ThermalCritical, "highest heat at which this machine contributes: nominal, fair, serious or critical (critical: no ceiling of yours)")
	tasks := fs.Int("max-tasks-per-min", 0, "at most this many tasks from the mesh a minute (0: no limit of yours)")
	traffic := fs.String("max-bytes-per-hour", "0", "at most this much mesh traffic an hour, bytes in and out of the tasks served for others: bytes, or with a unit (500MB, 2GB, 1GiB); 0: no cap of yours")
	memShare := fs.Int("max-memory-share", 0, "at most this share of the memory free when the node starts for mesh work, in percent (0: no cap of yours)")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	dir, err := dataDirOrDefault(*dataDir)
	if err != nil {
		return err
	}
	if *withdraw { // whatever the other flags say: withdrawing must always work
		if err := participation.WithdrawConsent(dir); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "consent withdrawn: this machine contributes nothing and uses no cloud from now on (a running node stops taking new work at once)")
		return nil
	}
	wording, err := consentWording(*textFile)
	if err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case *show:
		c, ok, err := participation.LoadConsent(dir)
		if err != nil {
			return err
		}
		if !ok {
			fmt.Fprintf(stdout, "no consent recorded in %s: the node runs models for you but contributes nothing.\nrun 'meshinfer consent' to decide.\n", dir)
			return nil
		}
		printConsent(stdout, c)
		if set["consent-text"] && !c.GivenFor(participation.WordingHash(wording)) {
			fmt.Fprintf(stdout, "consent wording changed: %s is not the wording this consent was given to; run 'meshinfer consent' again\n", *textFile)
		}
		return nil
	case set["run-local"] || set["contribute"] || set["cloud"] || set["battery-floor"] || set["pause-on-metered"] ||
		set["require-charging"] || set["thermal-max-state"] || set["max-tasks-per-min"] || set["max-bytes-per-hour"] ||
		set["max-memory-share"]:
		c := participation.Consent{Version: participation.ConsentVersion, GivenAt: time.Now().UTC(),
			WordingSHA256: participation.WordingHash(wording)}
		for _, f := range []struct {
			name string
			v    string
			dst  *bool
		}{{"run-local", *runLocal, &c.RunLocal}, {"contribute", *contribute, &c.Contribute}, {"cloud", *cloud, &c.CloudFallback},
			{"pause-on-metered", *metered, &c.PauseOnMetered}, {"require-charging", *charging, &c.RequireCharging}} {
			if f.v == "" {
				continue
			}
			b, ok := parseYesNo(f.v)
			if !ok {
				return fmt.Errorf("--%s %q: say yes or no", f.name, f.v)
			}
			*f.dst = b
		}
		c.BatteryFloor, c.ThermalMaxState, c.MaxTasksPerMin, c.MaxMemoryShare = *floor, *thermal, *tasks, *memShare
		if c.BatteryFloor < 0 || c.BatteryFloor > 100 {
			return fmt.Errorf("--battery-floor %d: a percentage, 0 to 100", c.BatteryFloor)
		}
		if !isThermalState(c.ThermalMaxState) {
			return fmt.Errorf("--thermal-max-state %q: say nominal, fair, serious or critical", c.ThermalMaxState)
		}
		if c.MaxTasksPerMin < 0 || c.MaxTasksPerMin > participation.MaxTasksPerMinLimit {
			return fmt.Errorf("--max-tasks-per-min %d: 0 (no limit) to %d", c.MaxTasksPerMin, participation.MaxTasksPerMinLimit)
		}
		if c.MaxMemoryShare < 0 || c.MaxMemoryShare > 100 {
			return fmt.Errorf("--max-memory-share %d: a percentage, 0 (no cap) to 100", c.MaxMemoryShare)
		}
		if c.MaxBytesPerHour, err = parseBytes(*traffic); err != nil {
			return fmt.Errorf("--max-bytes-per-hour %q: %w", *traffic, err)
		}
		if err := participation.SaveConsent(dir, c); err != nil {
			return err
		}
		printConsent(stdout, c)
		return nil
	}
	if !isTerminal(os.Stdin) {
		fmt.Fprintln(stderr, "meshinfer consent: no terminal to ask in; give the choices as flags, e.g.\n  meshinfer consent --run-local yes --contribute yes --cloud no")
		return errUsage
	}
	return askAndSave(dir, wording, stdout)
}

// consentWording is the wording in file (--consent-text), or the built-in one when file is
// "".
func consentWording(file string) (string, error) {
	if file == "" {
		return participation.ConsentWording, nil
	}
	return participation.LoadConsentWording(file)
}

// askAndSave asks in the terminal on stdin, with wording, records the answer in dir and
// shows it.
func askAndSave(dir, wording string, stdout io.Writer) error {
	c, err := askConsent(os.Stdin, stdout, wording)
	if err != nil {
		return err
	}
	if err := participation.SaveConsent(dir, c); err != nil {
		return err
	}
	printConsent(stdout, c)
	return nil
}

func dataDirOrDefault(dir string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	return node.DefaultDataDir()
}

// askConsent shows wording and asks the owner, in plain words, each choice separately; then
// the battery floor and pausing on metered connections, and, if the owner wants, the other
// limits.
func askConsent(in io.Reader, out io.Writer, wording string) (participation.Consent, error) {
	r := bufio.NewReader(io.LimitReader(in, 1<<16))
	fmt.Fprint(out, wording)
	if !strings.HasSuffix(wording, "\n") {
		fmt.Fprintln(out)
	}
	c := participation.Consent{Version: participation.ConsentVersion, WordingSHA256: participation.WordingHash(wording)}
	var err error
	// line asks q, with hint, until parse accepts the answer; an empty answer is def.
	line := func(q, hint, def, again string, parse func(string) bool) {
		for err == nil {
			fmt.Fprintf(out, "%s [%s] ", q, hint)
			l, rerr := r.ReadString('\n')
			ans := strings.TrimSpace(l)
			if ans == "" {
				if rerr != nil {
					err = fmt.Errorf("no answer (%w): nothing recorded", rerr)
					return
				}
				ans = def
			}
			if parse(ans) {
				return
			}
			fmt.Fprintln(out, again)
		}
	}
	ask := func(q string, def bool) bool {
		hint, got := "y/N", false
		if def {
			hint = "Y/n"
		}
		line(q, hint, yesNo(def), "please answer yes or no", func(s string) bool {
			b, ok := parseYesNo(s)
			got = b
			return ok
		})
		return got && err == nil
	}
	c.RunLocal = ask("1. Run models locally on this machine?", true)
	c.Contribute = ask("2. Contribute this machine's compute to other people's requests in the mesh?", false)
	c.CloudFallback = ask("3. Allow sending requests to a cloud API when this machine and the mesh cannot serve them?", false)
	c.PauseOnMetered = ask("Pause contributing on metered (cellular) connections?", true)
	floor := strconv.Itoa(participation.DefaultBatteryFloor)
	line("Stop contributing below which battery level, in percent?", floor, floor, "please give a number from 0 to 100",
		func(s string) bool {
			n, perr := strconv.Atoi(strings.TrimSuffix(s, "%"))
			c.BatteryFloor = n
			return perr == nil && n >= 0 && n <= 100
		})
	c.ThermalMaxState = caps.ThermalCritical
	if ask("Set further limits on contributing (only while charging, a heat ceiling, tasks a minute, mesh traffic an hour, memory)?", false) {
		c.RequireCharging = ask("Contribute only while charging (or on mains)?", false)
		line("Highest heat at which to contribute: nominal, fair, serious or critical?", caps.ThermalCritical, caps.ThermalCritical,
			"please say nominal, fair, serious or critical", func(s string) bool {
				c.ThermalMaxState = strings.ToLower(s)
				return isThermalState(c.ThermalMaxState)
			})
		line("At most how many tasks from the mesh a minute (0: no limit)?", "0", "0",
			fmt.Sprintf("please give a number from 0 to %d", participation.MaxTasksPerMinLimit), func(s string) bool {
				n, perr := strconv.Atoi(s)
				c.MaxTasksPerMin = n
				return perr == nil && n >= 0 && n <= participation.MaxTasksPerMinLimit
			})
		line("At most how much mesh traffic an hour, in bytes or with a unit such as 500MB or 2GB (0: no cap)?", "0", "0",
			"please give an amount such as 0, 500MB or 2GB", func(s string) bool {
				n, perr := parseBytes(s)
				c.MaxBytesPerHour = n
				return perr == nil
			})
		line("At most what share of the memory free at start for mesh work, in percent (0: no cap)?", "0", "0",
			"please give a number from 0 to 100", func(s string) bool {
				n, perr := strconv.Atoi(strings.TrimSuffix(s, "%"))
				c.MaxMemoryShare = n
				return perr == nil && n >= 0 && n <= 100
			})
	}
	if err != nil {
		return participation.Consent{}, err
	}
	c.GivenAt = time.Now().UTC()
	return c, nil
}

// isThermalState reports whether s names a thermal state.
func isThermalState(s string) bool {
	switch s {
	case caps.ThermalNominal, caps.ThermalFair, caps.ThermalSerious, caps.ThermalCritical:
		return true
	}
	return false
}

// byteUnits are the units of amounts of bytes on the command line, decimal and binary (k, m,
// g and t alone are binary), longest first.
var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12}, {"b", 1},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40},
}

// splitUnit splits an amount of bytes into its number and its unit's multiplier (byteUnits,
// any case, a space allowed between them); a number without a unit counts in bare.
func splitUnit(s string, bare int64) (string, int64) {
	num := strings.TrimSpace(s)
	lower := strings.ToLower(num)
	for _, u := range byteUnits {
		if strings.HasSuffix(lower, u.suffix) {
			return strings.TrimSpace(num[:len(num)-len(u.suffix)]), u.mult
		}
	}
	return num, bare
}

// parseBytes reads an amount of bytes: a whole number, optionally followed by a unit
// (byteUnits), from 0 to participation.MaxBytesPerHourLimit.
func parseBytes(s string) (int64, error) {
	num, mult := splitUnit(s, 1)
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("not an amount of bytes: give a whole number, optionally with a unit (500MB, 2GB, 1GiB)")
	}
	if n > participation.MaxBytesPerHourLimit/mult {
		return 0, fmt.Errorf("more than %s", formatBytes(participation.MaxBytesPerHourLimit))
	}
	return n * mult, nil
}

// formatBytes writes n bytes for people, in decimal units to two decimals: 950 B, 1.5 kB,
// 500 MB, 2.25 GB.
func formatBytes(n int64) string {
	units := []string{"B", "kB", "MB", "GB", "TB", "PB"}
	v, i := float64(n), 0
	for v >= 1000 && i < len(units)-1 {
		v, i = v/1000, i+1
	}
	if i == 0 {
		return fmt.Sprintf("%d B", n)
	}
	num := strings.TrimRight(strings.TrimRight(strconv.FormatFloat(v, 'f', 2, 64), "0"), ".")
	return num + " " + units[i]
}

func parseYesNo(s string) (bool, bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "y", "yes", "true", "1":
		return true, true
	case "n", "no", "false", "0":
		return false, true
	}
	return false, false
}

func printConsent(w io.Writer, c participation.Consent) {
	yn := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	fmt.Fprintf(w, "consent (wording v%d, given %s):\n", c.Version, c.GivenAt.Local().Format(time.RFC1123))
	fmt.Fprintf(w, "  run models locally          %s\n", yn(c.RunLocal))
	fmt.Fprintf(w, "  contribute to the mesh      %s\n", yn(c.Contribute))
	fmt.Fprintf(w, "  cloud fallback              %s\n", yn(c.CloudFallback))
	fmt.Fprintf(w, "  battery floor               %d%%\n", c.BatteryFloor)
	fmt.Fprintf(w, "  pause on metered networks   %s\n", yn(c.PauseOnMetered))
	fmt.Fprintf(w, "  only while charging         %s\n", yn(c.RequireCharging))
	p := c.OwnerPolicy()
	fmt.Fprintf(w, "  heat ceiling                %s\n", cond(p.ThermalMaxState == caps.ThermalCritical, "none (critical)", p.ThermalMaxState))
	fmt.Fprintf(w, "  tasks a minute              %s\n", cond(p.MaxTasksPerMin == 0, "no limit", strconv.Itoa(p.MaxTasksPerMin)))
	fmt.Fprintf(w, "  mesh traffic an hour        %s\n", cond(p.MaxBytesPerHour == 0, "no cap", formatBytes(p.MaxBytesPerHour)))
	fmt.Fprintf(w, "  memory for mesh work        %s\n", cond(p.MaxMemoryShare == 0, "no cap", fmt.Sprintf("%d%% of what is free at start", p.MaxMemoryShare)))
	words := "the built-in wording"
	if c.WordingHash() != participation.DefaultWordingHash() {
		words = "the deployer's wording"
	}
	fmt.Fprintf(w, "  given to                    %s (sha256 %s)\n", words, c.WordingHash())
	fmt.Fprintln(w, "the deployer's profile applies where it is stricter; withdraw at any time: meshinfer consent --withdraw")
}

// isTerminal reports whether f is a terminal (a tty, not a pipe, file or /dev/null).
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
