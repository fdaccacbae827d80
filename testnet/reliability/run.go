package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"time"
)

// A group is one `go test` invocation: every run of the selected cases that shares a
// package, build tags and -race goes into one, so each test binary is built and linked
// once (a -race link of the testnet binary takes longer than most of its tests). Its
// timeout is the sum of its runs', at most maxGroupTimeout.
type group struct {
	pkg, tags string
	race      bool
	tests     []string
	timeout   time.Duration
}

// maxGroupTimeout is the whole run's budget (docs/reliability.md: under 30 min on 2
// cores): no one invocation may take longer.
const maxGroupTimeout = 30 * time.Minute

func (g group) key() string { return groupKey(g.pkg, g.tags, g.race) }

func groupKey(pkg, tags string, race bool) string {
	return fmt.Sprintf("%s|%s|%v", pkg, tags, race)
}

// groups merges the runs of cases into invocations, in the order of first appearance.
func groups(cases []Case) []*group {
	var out []*group
	byKey := map[string]*group{}
	for _, c := range cases {
		for _, r := range c.Runs {
			k := groupKey(r.Pkg, r.Tags, r.Race)
			g := byKey[k]
			if g == nil {
				g = &group{pkg: r.Pkg, tags: r.Tags, race: r.Race}
				byKey[k] = g
				out = append(out, g)
			}
			g.timeout = min(g.timeout+r.Timeout, maxGroupTimeout)
			for _, t := range r.Tests {
				if !contains(g.tests, t) {
					g.tests = append(g.tests, t)
				}
			}
		}
	}
	return out
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// runRegexp anchors test names for -run: exactly these top-level tests and all their
// subtests.
func runRegexp(tests []string) string {
	return "^(" + strings.Join(tests, "|") + ")$"
}

// testArgs are the flags of one `go test`, without -json (the command a reader runs).
func testArgs(pkg, tags string, race bool, timeout time.Duration, tests []string) []string {
	args := []string{"test"}
	if race {
		args = append(args, "-race")
	}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	args = append(args, "-count=1", "-timeout", timeout.String(), "-run", runRegexp(tests), pkg)
	return args
}

// fuzzArgs run one fuzz target for d after its seeds (go test fuzzes one target per
// invocation). No -race: fuzzing is about inputs, and the race detector would cut the
// executions tenfold.
func fuzzArgs(pkg, target string, d time.Duration) []string {
	return []string{"test", "-count=1", "-run", "^$", "-fuzz", "^" + target + "$", "-fuzztime", d.String(), pkg}
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// testResult is what one top-level test reported.
type testResult struct {
	Action  string   // pass, fail or skip; "" when the test never reported (not found, or the binary died)
	Figures []figure // the last figure line of each (sub)test, in the order they first appeared
	Log     string   // the last log line of the test or its subtests (a skip's reason, a failure's message)
	FailLog string   // the first log line of a failing (sub)test
	Passed  int      // subtests that passed (a fuzz target's seed inputs)
	// Execs and Elapsed are the last progress line of a fuzzing run.
	Execs, Elapsed string
}

// figure is one `figure <case>: <text>` line a test logged.
type figure struct {
	Case, Test, Text string
}

// figureLine matches the convention of docs/reliability.md: a test reports its figure
// with t.Logf("figure F4: %s", text); go test prefixes the file and line.
var figureLine = regexp.MustCompile(`^\s*\S+\.go:\d+: figure ([A-Z][0-9]+): (.*)$`)

// logLine matches any t.Log line (the first line of it).
var logLine = regexp.MustCompile(`^\s*\S+\.go:\d+: (.*)$`)

// fuzzProgress matches the fuzzing engine's progress line.
var fuzzProgress = regexp.MustCompile(`fuzz: elapsed: (\S+), execs: (\d+)`)

// result is everything one invocation reported: per top-level test, and the package's
// own lines (a build failure, a timeout's panic).
type result struct {
	Tests   map[string]*testResult
	PkgFail bool
	PkgLog  []string
}

// parse reads `go test -json` events. Each figure line is attributed to the test that
// logged it, subtests to their top-level test; the last line per (case, test) wins.
func parse(r io.Reader) (*result, error) {
	res := &result{Tests: map[string]*testResult{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// Not an event: go test itself speaking (a build error on older Go).
			res.PkgLog = append(res.PkgLog, sc.Text())
			continue
		}
		if e.Test == "" {
			switch e.Action {
			case "fail", "build-fail":
				res.PkgFail = true
			case "output", "build-output":
				if m := fuzzProgress.FindStringSubmatch(e.Output); m != nil {
					// The fuzzing engine's lines belong to no test.
					for _, tr := range res.Tests {
						tr.Elapsed, tr.Execs = m[1], m[2]
					}
				}
				res.PkgLog = append(res.PkgLog, strings.TrimRight(e.Output, "\n"))
			}
			continue
		}
		top, _, sub := strings.Cut(e.Test, "/")
		tr := res.Tests[top]
		if tr == nil {
			tr = &testResult{}
			res.Tests[top] = tr
		}
		switch e.Action {
		case "pass", "fail", "skip":
			if !sub {
				tr.Action = e.Action
			} else if e.Action == "pass" {
				tr.Passed++
			}
		case "output":
			line := strings.TrimRight(e.Output, "\n")
			if m := figureLine.FindStringSubmatch(line); m != nil {
				tr.setFigure(figure{Case: m[1], Test: e.Test, Text: m[2]})
			}
			if m := logLine.FindStringSubmatch(line); m != nil {
				tr.Log = m[1]
			}
			if strings.Contains(line, "--- FAIL") && tr.FailLog == "" {
				tr.FailLog = tr.Log
			}
			if m := fuzzProgress.FindStringSubmatch(line); m != nil {
				tr.Elapsed, tr.Execs = m[1], m[2]
			}
		}
	}
	return res, sc.Err()
}

func (tr *testResult) setFigure(f figure) {
	for i := range tr.Figures {
		if tr.Figures[i].Case == f.Case && tr.Figures[i].Test == f.Test {
			tr.Figures[i] = f
			return
		}
	}
	tr.Figures = append(tr.Figures, f)
}

// goTest runs `go test -json args...` in dir and parses what it reports. Its own exit
// status says nothing the events do not (a failing test exits 1), so only an error
// starting it counts. Cancelling ctx interrupts go test, which passes the interrupt to
// the test binary, so the tests' cleanups run and their processes are reaped.
func goTest(ctx context.Context, dir string, args []string, stderr io.Writer) (*result, error) {
	full := append([]string{args[0], "-json"}, args[1:]...)
	cmd := exec.CommandContext(ctx, "go", full...)
	cmd.Dir = dir
	cmd.Stderr = stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	res, perr := parse(out)
	werr := cmd.Wait()
	if perr != nil {
		return nil, perr
	}
	var exit *exec.ExitError
	if werr != nil && !errors.As(werr, &exit) {
		return res, werr
	}
	return res, nil
}
