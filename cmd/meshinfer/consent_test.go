package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/mesh/participation"
	"github.com/meshinfer/meshinfer/node/console"
)

// openPTY returns a pseudo-terminal pair: what is written to master arrives on slave as
// typed input.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock pty: %v", err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open pty slave: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	go io.Copy(io.Discard, m) // the terminal's echo
	return m, s
}

// The interactive prompt, driven through a pseudo-terminal: each choice asked separately,
// a wrong answer asked again, defaults on an empty line, the result recorded.
func TestConsentPromptInATerminal(t *testing.T) {
	master, slave := openPTY(t)
	old := os.Stdin
	os.Stdin = slave
	t.Cleanup(func() { os.Stdin = old })

	// run locally: default (yes); contribute: "maybe" then "y"; cloud: n; metered: default
	// (yes); battery floor: 45; further limits: default (no).
	if _, err := master.WriteString("\nmaybe\ny\nn\n\n45\n\n"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	code, stdout, stderr := runCmd(t, "consent", "--data-dir", dir)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, s := range []string{"three separate choices", "1. Run models locally", "2. Contribute", "3. Allow sending",
		"please answer yes or no", "meshinfer consent --withdraw"} {
		if !strings.Contains(stdout, s) {
			t.Errorf("prompt does not say %q:\n%s", s, stdout)
		}
	}
	c, ok, err := participation.LoadConsent(dir)
	if err != nil || !ok {
		t.Fatalf("consent not recorded: %v", err)
	}
	if !c.RunLocal || !c.Contribute || c.CloudFallback || !c.PauseOnMetered || c.BatteryFloor != 45 || c.Version != participation.ConsentVersion ||
		c.RequireCharging || c.ThermalMaxState != caps.ThermalCritical || c.MaxTasksPerMin != 0 || c.MaxBytesPerHour != 0 ||
		c.WordingSHA256 != participation.DefaultWordingHash() {
		t.Fatalf("recorded %+v", c)
	}
}

// The prompt with the deployer's wording (--consent-text) shows that text, not the built-in
// one, records its hash, and asks the further limits when the owner wants them.
func TestConsentPromptWithDeployersWordingAndLimits(t *testing.T) {
	master, slave := openPTY(t)
	old := os.Stdin
	os.Stdin = slave
	t.Cleanup(func() { os.Stdin = old })
	const wording = "ACME asks: may this laptop help the ACME mesh?" // no final line break
	textFile := filepath.Join(t.TempDir(), "consent.txt")
	if err := os.WriteFile(textFile, []byte(wording), 0o600); err != nil {
		t.Fatal(err)
	}
	// run locally yes; contribute y; cloud default (no); metered n; floor default (30);
	// further limits y: charging y, heat "warm" then "fair", tasks 12, traffic "lots" then
	// "500MB", memory "200" then "30%".
	if _, err := master.WriteString("y\ny\n\nn\n\ny\ny\nwarm\nfair\n12\nlots\n500MB\n200\n30%\n"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	code, stdout, stderr := runCmd(t, "consent", "--data-dir", dir, "--consent-text", textFile)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, wording+"\n") || strings.Contains(stdout, "three separate choices") {
		t.Errorf("the prompt does not show the deployer's wording, alone:\n%s", stdout)
	}
	for _, s := range []string{"please say nominal, fair, serious or critical", "please give an amount", "the deployer's wording",
		"mesh traffic an hour        500 MB", "heat ceiling                fair", "please give a number from 0 to 100",
		"memory for mesh work        30% of what is free at start"} {
		if !strings.Contains(stdout, s) {
			t.Errorf("output does not say %q:\n%s", s, stdout)
		}
	}
	c, ok, err := participation.LoadConsent(dir)
	if err != nil || !ok {
		t.Fatalf("consent not recorded: %v", err)
	}
	want := participation.Consent{Version: participation.ConsentVersion, GivenAt: c.GivenAt, RunLocal: true, Contribute: true,
		BatteryFloor: 30, RequireCharging: true, ThermalMaxState: caps.ThermalFair, MaxTasksPerMin: 12,
		MaxBytesPerHour: 500_000_000, MaxMemoryShare: 30, WordingSHA256: participation.WordingHash(wording)}
	if c != want {
		t.Fatalf("recorded %+v, want %+v", c, want)
	}
}

func TestConsentFlagsShowWithdraw(t *testing.T) {
	dir := t.TempDir()
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	old := os.Stdin
	os.Stdin = null
	t.Cleanup(func() { os.Stdin = old })
	// No terminal and no flags: say how, record nothing.
	code, _, stderr := runCmd(t, "consent", "--data-dir", dir)
	if code != 2 || !strings.Contains(stderr, "--contribute yes") {
		t.Fatalf("no terminal: exit %d, stderr %q", code, stderr)
	}
	code, stdout, _ := runCmd(t, "consent", "--data-dir", dir, "--show")
	if code != 0 || !strings.Contains(stdout, "no consent recorded") {
		t.Fatalf("show without consent: exit %d, %q", code, stdout)
	}
	code, _, stderr = runCmd(t, "consent", "--data-dir", dir, "--contribute", "perhaps")
	if code != 1 || !strings.Contains(stderr, "say yes or no") {
		t.Fatalf("bad answer: exit %d, stderr %q", code, stderr)
	}
	code, stdout, _ = runCmd(t, "consent", "--data-dir", dir, "--contribute", "yes", "--run-local", "yes", "--battery-floor", "40")
	if code != 0 || !strings.Contains(stdout, "contribute to the mesh      yes") || !strings.Contains(stdout, "cloud fallback              no") {
		t.Fatalf("flags: exit %d, %q", code, stdout)
	}
	if c, ok, _ := participation.LoadConsent(dir); !ok || !c.Contribute || c.CloudFallback || c.BatteryFloor != 40 {
		t.Fatalf("recorded %+v", c)
	}
	// The owner's other limits, as flags.
	code, stdout, stderr = runCmd(t, "consent", "--data-dir", dir, "--contribute", "yes", "--require-charging", "yes",
		"--thermal-max-state", "serious", "--max-tasks-per-min", "20", "--max-bytes-per-hour", "1.5GB")
	if code != 1 || !strings.Contains(stderr, "--max-bytes-per-hour") {
		t.Fatalf("a fraction of a unit: exit %d, stderr %q", code, stderr)
	}
	code, stdout, _ = runCmd(t, "consent", "--data-dir", dir, "--contribute", "yes", "--require-charging", "yes",
		"--thermal-max-state", "serious", "--max-tasks-per-min", "20", "--max-bytes-per-hour", "2GiB", "--max-memory-share", "40")
	if code != 0 || !strings.Contains(stdout, "only while charging         yes") || !strings.Contains(stdout, "tasks a minute              20") {
		t.Fatalf("limit flags: exit %d, %q", code, stdout)
	}
	c, _, _ := participation.LoadConsent(dir)
	if p := c.OwnerPolicy(); !p.RequireCharging || p.ThermalMaxState != caps.ThermalSerious || p.MaxTasksPerMin != 20 ||
		p.MaxBytesPerHour != 2<<30 || p.MaxMemoryShare != 40 || p.BatteryMinLevel != participation.DefaultBatteryFloor || !p.PauseOnMetered {
		t.Fatalf("recorded limits %+v", p)
	}
	if c.WordingSHA256 != participation.DefaultWordingHash() {
		t.Fatalf("recorded wording hash %q, want the built-in wording's", c.WordingSHA256)
	}
	for _, bad := range [][]string{
		{"--thermal-max-state", "warm"}, {"--max-tasks-per-min", "-1"}, {"--max-tasks-per-min", "10001"},
		{"--max-bytes-per-hour", "-5"}, {"--max-bytes-per-hour", "2 parsecs"}, {"--require-charging", "sometimes"},
		{"--max-memory-share", "101"}, {"--max-memory-share", "-1"},
	} {
		code, _, stderr := runCmd(t, append([]string{"consent", "--data-dir", dir, "--contribute", "yes"}, bad...)...)
		if code != 1 || !strings.Contains(stderr, bad[0]) {
			t.Errorf("consent %s %s: exit %d, stderr %q; want an error naming the flag", bad[0], bad[1], code, stderr)
		}
	}
	if got, _, _ := participation.LoadConsent(dir); got != c {
		t.Fatalf("a refused flag changed the record: %+v", got)
	}

	code, stdout, _ = runCmd(t, "consent", "--data-dir", dir, "--withdraw")
	if code != 0 || !strings.Contains(stdout, "withdrawn") {
		t.Fatalf("withdraw: exit %d, %q", code, stdout)
	}
	if _, ok, _ := participation.LoadConsent(dir); ok {
		t.Fatal("consent still recorded after withdrawal")
	}
}

func TestTestnetUnknownScenario(t *testing.T) {
	code, _, stderr := runCmd(t, "testnet", "--scenario", "flood")
	if code != 2 || !strings.Contains(stderr, "battery-drain") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
}

func TestTestnetBadFaults(t *testing.T) {
	for _, f := range []string{"liar", "liar=-1", "gremlin=2", "slow=x"} {
		code, _, stderr := runCmd(t, "testnet", "--faults", f)
		if code != 2 || !strings.Contains(stderr, "--faults") {
			t.Fatalf("--faults %s: exit %d, stderr %q", f, code, stderr)
		}
	}
}

// --consent-text: the consent given with it keeps its hash; --show tells a record given to
// other wording; a node started with other wording says to answer again; a file too large or
// missing is an error that names it.
func TestConsentText(t *testing.T) {
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	old := os.Stdin
	os.Stdin = null
	t.Cleanup(func() { os.Stdin = old })
	tmp := t.TempDir()
	v1, v2 := filepath.Join(tmp, "v1.txt"), filepath.Join(tmp, "v2.txt")
	for path, text := range map[string]string{v1: "Help the mesh? v1\n", v2: "Help the mesh? v2, with more\n"} {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	code, stdout, stderr := runCmd(t, "consent", "--data-dir", dir, "--consent-text", v1, "--contribute", "yes")
	if code != 0 || !strings.Contains(stdout, "the deployer's wording (sha256 "+participation.WordingHash("Help the mesh? v1\n")+")") {
		t.Fatalf("consent with v1: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	code, stdout, _ = runCmd(t, "consent", "--data-dir", dir, "--show", "--consent-text", v1)
	if code != 0 || strings.Contains(stdout, "wording changed") {
		t.Fatalf("show with the same wording: exit %d, %q", code, stdout)
	}
	code, stdout, _ = runCmd(t, "consent", "--data-dir", dir, "--show", "--consent-text", v2)
	if code != 0 || !strings.Contains(stdout, "consent wording changed") {
		t.Fatalf("show with other wording: exit %d, %q; want it to say the wording changed", code, stdout)
	}

	// The node's first-run check: the same wording asks nothing; other wording (or the
	// built-in one) says to answer again, without a terminal.
	var out, errOut strings.Builder
	if err := firstRunConsent(dir, v1, "Help the mesh? v1\n", &out, &errOut); err != nil || errOut.Len() != 0 {
		t.Fatalf("first run with the consented wording: %v, %q", err, errOut.String())
	}
	if err := firstRunConsent(dir, v2, "Help the mesh? v2, with more\n", &out, &errOut); err != nil ||
		!strings.Contains(errOut.String(), "consent wording changed: run 'meshinfer consent' again") ||
		!strings.Contains(errOut.String(), "--consent-text "+v2) {
		t.Fatalf("first run with changed wording: %v, %q", err, errOut.String())
	}
	errOut.Reset()
	if err := firstRunConsent(dir, "", participation.ConsentWording, &out, &errOut); err != nil ||
		!strings.Contains(errOut.String(), "consent wording changed") {
		t.Fatalf("first run with the built-in wording after consent to the deployer's: %v, %q", err, errOut.String())
	}

	big := filepath.Join(tmp, "big.txt")
	if err := os.WriteFile(big, []byte(strings.Repeat("a", participation.MaxConsentWording+1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, stdout, _ := runCmd(t, "consent", "--data-dir", dir, "--withdraw", "--consent-text", big); code != 0 || !strings.Contains(stdout, "withdrawn") {
		t.Fatalf("withdraw with a bad --consent-text: exit %d, %q; want withdrawn all the same", code, stdout)
	}
	for _, cmd := range []string{"consent", "node"} {
		code, _, stderr := runCmd(t, cmd, "--data-dir", dir, "--consent-text", big, "--contribute", "yes")
		if cmd == "node" {
			code, _, stderr = runCmd(t, cmd, "--data-dir", dir, "--consent-text", big, "--console", "off", "--api", "off")
		}
		if code != 1 || !strings.Contains(stderr, "64 KiB") || !strings.Contains(stderr, big) {
			t.Errorf("%s --consent-text with a file too large: exit %d, stderr %q", cmd, code, stderr)
		}
		code, _, stderr = runCmd(t, cmd, "--data-dir", dir, "--consent-text", filepath.Join(tmp, "absent.txt"))
		if code != 1 || !strings.Contains(stderr, "absent.txt") {
			t.Errorf("%s --consent-text with a missing file: exit %d, stderr %q", cmd, code, stderr)
		}
	}
}

func TestParseAndFormatBytes(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int64
	}{{"0", 0}, {"1234", 1234}, {"500MB", 500_000_000}, {"500 mb", 500_000_000}, {"2GB", 2_000_000_000}, {"1GiB", 1 << 30},
		{"3 KiB", 3 << 10}, {"7b", 7}, {"1TB", 1_000_000_000_000}, {"1000TB", participation.MaxBytesPerHourLimit}} {
		if got, err := parseBytes(tt.in); err != nil || got != tt.want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "-1", "1.5GB", "GB", "2 parsecs", "1001TB", "99999999999999999999"} {
		if got, err := parseBytes(bad); err == nil {
			t.Errorf("parseBytes(%q) = %d, want an error", bad, got)
		}
	}
	for _, tt := range []struct {
		n    int64
		want string
	}{{0, "0 B"}, {999, "999 B"}, {1500, "1.5 kB"}, {500_000_000, "500 MB"}, {2_250_000_000, "2.25 GB"}, {1 << 30, "1.07 GB"}} {
		if got := formatBytes(tt.n); got != tt.want {
			t.Errorf("formatBytes(%d) = %q, want %q", tt.n, got, tt.want)
		}
	}
}

// meshinfer status says when the wording changed, what the traffic cap is and when it
// pauses the node.
func TestStatusShowsConsentWordingAndTrafficCap(t *testing.T) {
	var st console.Status
	st.Participation = console.Participation{
		Consent: console.Consent{WordingChanged: true}, Profile: "standard", Admission: "paused",
		Reasons: []string{"no_consent", "bandwidth_cap"}, MeshBytesLastHour: 2_500_000_000,
		Thresholds: participation.Policy{ThermalMaxState: caps.ThermalFair, MaxBytesPerHour: 2_000_000_000, MaxMemoryShare: 25},
	}
	var out strings.Builder
	renderStatus(&out, st, nil)
	for _, s := range []string{"consent wording changed: run 'meshinfer consent' again", "at its mesh traffic cap for the hour",
		"mesh traffic 2.5 GB in the last hour, at most 2 GB; memory for mesh work at most 25% of what was free at start"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("status does not say %q:\n%s", s, out.String())
		}
	}
}
