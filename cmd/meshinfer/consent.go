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

	"github.com/meshinfer/meshinfer/mesh/participation"
	"github.com/meshinfer/meshinfer/node"
)

const consentSynopsis = `Give, show or withdraw this machine owner's consent. Nothing is contributed to the mesh
before the owner agrees; withdrawing takes effect at once, also for a running node.

  meshinfer consent                       ask, in this terminal
  meshinfer consent --contribute yes --run-local yes --cloud no --battery-floor 30 --pause-on-metered yes
  meshinfer consent --show
  meshinfer consent --withdraw

With any of --run-local, --contribute, --cloud, --battery-floor or --pause-on-metered the
consent is recorded without asking (for scripts); choices not given are "no" (the battery
floor 30 % and pausing on metered connections keep their defaults).`

func runConsent(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("consent", consentSynopsis, stderr)
	dataDir := fs.String("data-dir", "", "where the consent is stored (default $XDG_DATA_HOME/meshinfer, else ~/.local/share/meshinfer)")
	withdraw := fs.Bool("withdraw", false, "withdraw consent: stop contributing and using the cloud at once")
	show := fs.Bool("show", false, "print the recorded consent")
	runLocal := fs.String("run-local", "", "yes or no: run models locally on this machine")
	contribute := fs.String("contribute", "", "yes or no: serve other people's requests from the mesh")
	cloud := fs.String("cloud", "", "yes or no: allow sending requests to a cloud API when this machine and the mesh cannot serve")
	floor := fs.Int("battery-floor", participation.DefaultBatteryFloor, "battery level in percent below which this machine stops contributing")
	metered := fs.String("pause-on-metered", "yes", "yes or no: stop contributing on a metered (cellular) connection")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	dir, err := dataDirOrDefault(*dataDir)
	if err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case *withdraw:
		if err := participation.WithdrawConsent(dir); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "consent withdrawn: this machine contributes nothing and uses no cloud from now on (a running node stops taking new work at once)")
		return nil
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
		return nil
	case set["run-local"] || set["contribute"] || set["cloud"] || set["battery-floor"] || set["pause-on-metered"]:
		c := participation.Consent{Version: participation.ConsentVersion, GivenAt: time.Now().UTC(), BatteryFloor: *floor}
		for _, f := range []struct {
			name string
			v    string
			dst  *bool
		}{{"run-local", *runLocal, &c.RunLocal}, {"contribute", *contribute, &c.Contribute}, {"cloud", *cloud, &c.CloudFallback}, {"pause-on-metered", *metered, &c.PauseOnMetered}} {
			if f.v == "" {
				continue
			}
			b, ok := parseYesNo(f.v)
			if !ok {
				return fmt.Errorf("--%s %q: say yes or no", f.name, f.v)
			}
			*f.dst = b
		}
		if c.BatteryFloor < 0 || c.BatteryFloor > 100 {
			return fmt.Errorf("--battery-floor %d: a percentage, 0 to 100", c.BatteryFloor)
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
	return askAndSave(dir, stdout)
}

// askAndSave asks in the terminal on stdin, records the answer in dir and shows it.
func askAndSave(dir string, stdout io.Writer) error {
	c, err := askConsent(os.Stdin, stdout)
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

// askConsent asks the owner, in plain words, each choice separately.
func askConsent(in io.Reader, out io.Writer) (participation.Consent, error) {
	r := bufio.NewReader(io.LimitReader(in, 1<<16))
	fmt.Fprint(out, participation.ConsentWording)
	c := participation.Consent{Version: participation.ConsentVersion}
	var err error
	ask := func(q string, def bool) bool {
		if err != nil {
			return false
		}
		hint := "[y/N]"
		if def {
			hint = "[Y/n]"
		}
		for {
			fmt.Fprintf(out, "%s %s ", q, hint)
			line, rerr := r.ReadString('\n')
			ans := strings.TrimSpace(line)
			if ans == "" && rerr != nil {
				err = fmt.Errorf("no answer (%w): nothing recorded", rerr)
				return false
			}
			if ans == "" {
				return def
			}
			if b, ok := parseYesNo(ans); ok {
				return b
			}
			fmt.Fprintln(out, "please answer yes or no")
		}
	}
	c.RunLocal = ask("1. Run models locally on this machine?", true)
	c.Contribute = ask("2. Contribute this machine's compute to other people's requests in the mesh?", false)
	c.CloudFallback = ask("3. Allow sending requests to a cloud API when this machine and the mesh cannot serve them?", false)
	c.PauseOnMetered = ask("Pause contributing on metered (cellular) connections?", true)
	c.BatteryFloor = participation.DefaultBatteryFloor
	for err == nil {
		fmt.Fprintf(out, "Stop contributing below which battery level, in percent? [%d] ", participation.DefaultBatteryFloor)
		line, rerr := r.ReadString('\n')
		ans := strings.TrimSpace(line)
		if ans == "" {
			if rerr != nil {
				err = fmt.Errorf("no answer (%w): nothing recorded", rerr)
			}
			break
		}
		n, perr := strconv.Atoi(strings.TrimSuffix(ans, "%"))
		if perr == nil && n >= 0 && n <= 100 {
			c.BatteryFloor = n
			break
		}
		fmt.Fprintln(out, "please give a number from 0 to 100")
	}
	if err != nil {
		return participation.Consent{}, err
	}
	c.GivenAt = time.Now().UTC()
	return c, nil
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
	fmt.Fprintln(w, "withdraw at any time: meshinfer consent --withdraw")
}

// isTerminal reports whether f is a terminal (a tty, not a pipe, file or /dev/null).
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
