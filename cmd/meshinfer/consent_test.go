package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/meshinfer/meshinfer/mesh/participation"
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
	// (yes); battery floor: 45.
	if _, err := master.WriteString("\nmaybe\ny\nn\n\n45\n"); err != nil {
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
	if !c.RunLocal || !c.Contribute || c.CloudFallback || !c.PauseOnMetered || c.BatteryFloor != 45 || c.Version != participation.ConsentVersion {
		t.Fatalf("recorded %+v", c)
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
