// Command reliability is `make reliability`: it runs the test of every case of the
// reliability catalogue (docs/reliability.md, which also maps the cases to
// the code) that this machine can run, and prints one markdown table: the case, what was
// measured, the figure, the goal, the verdict and the command that runs that case alone.
//
// The table of cases is cases.go, all 37 of them (L1-L6, F1-F19, Z1-Z12): each with its
// goal as the catalogue writes it or the replacement a test actually asserts, said as
// such, and how to run it (package, tests, build tags, -race, timeout). A case without a
// test is listed as "not built", with what is missing; it is never run and never counted
// as a pass.
//
// Figures come from the tests themselves. A test reports what it measured with one log
// line of a fixed form,
//
//	t.Logf("figure F4: %s", text)
//
// and the runner takes, from `go test -json`'s output events, the last such line of each
// test (and subtest) for the case named in it; a case run by several tests shows each
// test's line. A fuzz target's figure is the runner's own: the seed inputs that passed,
// and with -fuzztime the executions of the fuzzing run.
//
// Verdicts: pass (every test of the case passed), fail (one failed, or never reported:
// renamed, or its binary died), skipped (a test skipped itself, the machine lacking
// something, such as a non-loopback address; not a pass), not built. The command exits 1
// when any case fails.
//
// Tests run with `go test -json -count=1`, one invocation per (package, tags, -race) with
// the tests of every selected case, so each binary is linked once; the invocations run one
// after the other, since the machine has 2 cores and the load and fault tests measure.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"time"
)

func main() {
	os.Exit(run())
}

func run() int {
	out := flag.String("o", "", "also write the table to this file")
	only := flag.String("case", "", "run only the cases whose id matches this regexp (e.g. '^(F4|L6)$')")
	fuzztime := flag.Duration("fuzztime", 0, "fuzz each Z case this long after its targets' seeds, shared among its targets (0: seeds only)")
	verbose := flag.Bool("v", false, "pass go test's stderr through")
	flag.Parse()

	cases := Cases()
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			fmt.Fprintln(os.Stderr, "reliability: -case:", err)
			return 2
		}
		var sel []Case
		for _, c := range cases {
			if re.MatchString(c.ID) {
				sel = append(sel, c)
			}
		}
		cases = sel
	}
	dir, err := moduleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "reliability:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	stderr := io.Discard
	if *verbose {
		stderr = os.Stderr
	}
	start := time.Now()
	results := map[string]*result{}
	for _, g := range groups(cases) {
		args := testArgs(g.pkg, g.tags, g.race, g.timeout, g.tests)
		t0 := time.Now()
		fmt.Fprintf(os.Stderr, "go %s\n", strings.Join(args, " "))
		res, err := goTest(ctx, dir, args, stderr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "reliability:", err)
			res = &result{PkgFail: true, PkgLog: []string{err.Error()}}
		}
		fmt.Fprintf(os.Stderr, "  %v\n", time.Since(t0).Round(time.Second))
		results[g.key()] = res
		if ctx.Err() != nil {
			break
		}
	}
	fuzzed := map[string]*result{}
	if *fuzztime > 0 {
		for _, c := range cases {
			targets := fuzzTargets(c)
			for _, ft := range targets {
				if ctx.Err() != nil {
					break
				}
				// A case's targets share its time (the catalogue's T3: 12 × 60 s).
				args := fuzzArgs(ft.pkg, ft.name, *fuzztime/time.Duration(len(targets)))
				t0 := time.Now()
				fmt.Fprintf(os.Stderr, "go %s\n", strings.Join(args, " "))
				res, err := goTest(ctx, dir, args, stderr)
				if err != nil {
					res = &result{PkgFail: true, PkgLog: []string{err.Error()}}
				}
				fmt.Fprintf(os.Stderr, "  %v\n", time.Since(t0).Round(time.Second))
				fuzzed[ft.pkg+" "+ft.name] = res
			}
		}
	}
	total := time.Since(start)

	rows := make([]row, len(cases))
	for i, c := range cases {
		rows[i] = judge(c, results, fuzzed)
	}
	var b strings.Builder
	writeTable(&b, rows)
	fmt.Fprintf(&b, "\n%s; %s on %d CPUs (%s).\n", counts(rows), total.Round(time.Second), runtime.NumCPU(), fuzzNote(*fuzztime))
	fmt.Print(b.String())
	if *out != "" {
		if err := os.WriteFile(*out, []byte(b.String()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "reliability:", err)
			return 2
		}
	}
	if ctx.Err() != nil {
		return 130
	}
	for _, r := range rows {
		if r.verdict == verdictFail {
			return 1
		}
	}
	return 0
}

func fuzzNote(d time.Duration) string {
	if d == 0 {
		return "fuzz targets: seeds only"
	}
	return "fuzz targets: seeds, then " + d.String() + " a case, shared among its targets"
}

// fuzzTarget is a fuzz target of a case: its package and its name.
type fuzzTarget struct{ pkg, name string }

// fuzzTargets lists c's fuzz targets, in the case table's order.
func fuzzTargets(c Case) []fuzzTarget {
	var out []fuzzTarget
	for _, r := range c.Runs {
		for _, t := range r.Tests {
			if strings.HasPrefix(t, "Fuzz") {
				out = append(out, fuzzTarget{r.Pkg, t})
			}
		}
	}
	return out
}

// moduleRoot is where go.mod is: the packages of the case table are relative to it.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the module")
	}
	return filepath.Dir(mod), nil
}
