package main

import (
	"fmt"
	"io"
	"strings"
)

const (
	verdictPass     = "pass"
	verdictFail     = "fail"
	verdictSkipped  = "skipped"
	verdictNotBuilt = "not built"
)

// row is one case's line of the table.
type row struct {
	c       Case
	verdict string
	figure  string
}

// judge gives a case its verdict and figure from what its tests reported: fail if any
// test failed or never reported, else skipped if any skipped itself, else pass. A case
// without runs is not built.
func judge(c Case, results, fuzzed map[string]*result) row {
	if len(c.Runs) == 0 {
		return row{c: c, verdict: verdictNotBuilt, figure: "not built: " + c.Missing}
	}
	var figs, fails, skips []string
	for _, r := range c.Runs {
		res := results[groupKey(r.Pkg, r.Tags, r.Race)]
		for _, name := range r.Tests {
			tr := (*testResult)(nil)
			if res != nil {
				tr = res.Tests[name]
			}
			switch {
			case tr == nil || tr.Action == "":
				fails = append(fails, name+" did not report"+pkgReason(res))
				continue
			case tr.Action == "fail":
				fails = append(fails, name+": "+firstNonEmpty(tr.FailLog, tr.Log, "failed"))
			case tr.Action == "skip":
				skips = append(skips, name+": "+firstNonEmpty(tr.Log, "skipped"))
			}
			for _, f := range tr.Figures {
				if f.Case == c.ID {
					figs = append(figs, f.Text)
				}
			}
			if strings.HasPrefix(name, "Fuzz") {
				figs = append(figs, fuzzFigure(name, tr, fuzzed[r.Pkg+" "+name], &fails))
			}
		}
	}
	switch {
	case len(fails) > 0:
		return row{c: c, verdict: verdictFail, figure: strings.Join(fails, "; ")}
	case len(skips) > 0:
		return row{c: c, verdict: verdictSkipped, figure: strings.Join(skips, "; ")}
	case len(figs) == 0:
		return row{c: c, verdict: verdictPass, figure: "(no figure line)"}
	}
	return row{c: c, verdict: verdictPass, figure: strings.Join(figs, "; ")}
}

// fuzzFigure is a fuzz target's figure: its seed inputs, and the executions of its
// fuzzing run if there was one (a failing run adds to fails).
func fuzzFigure(name string, seeds *testResult, fz *result, fails *[]string) string {
	s := fmt.Sprintf("%s: %d seed inputs", name, seeds.Passed)
	if fz == nil {
		return s
	}
	tr := fz.Tests[name]
	switch {
	case tr == nil || tr.Action == "":
		*fails = append(*fails, name+" fuzzing did not report"+pkgReason(fz))
	case tr.Action == "fail":
		*fails = append(*fails, name+" fuzzing: "+firstNonEmpty(tr.FailLog, tr.Log, "failed"))
	default:
		s += fmt.Sprintf(", %s execs fuzzing %s", firstNonEmpty(tr.Execs, "?"), firstNonEmpty(tr.Elapsed, "?"))
	}
	return s
}

// pkgReason is the line of the package's own output that says why a test never reported:
// a build error or a timeout's panic.
func pkgReason(res *result) string {
	if res == nil {
		return " (not run)"
	}
	for _, l := range res.PkgLog {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "panic:") || strings.Contains(l, "build failed") || strings.Contains(l, ".go:") {
			return " (" + l + ")"
		}
	}
	return ""
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// writeTable writes the markdown table of rows.
func writeTable(w io.Writer, rows []row) {
	fmt.Fprintln(w, "| case | measured | figure | goal | verdict | command |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s %s | %s | %s | %s | %s | %s |\n", r.c.ID, cell(r.c.Name), cell(r.c.Measured),
			cell(r.figure), cell(r.c.Goal), r.verdict, cell(command(r.c)))
	}
}

// command is the shell command that runs the case alone, as a code span.
func command(c Case) string {
	if len(c.Runs) == 0 {
		return ""
	}
	var cmds []string
	for _, r := range c.Runs {
		args := testArgs(r.Pkg, r.Tags, r.Race, r.Timeout, r.Tests)
		for i, a := range args {
			if strings.ContainsAny(a, "^$|()") {
				args[i] = "'" + a + "'"
			}
		}
		cmds = append(cmds, "go "+strings.Join(args, " "))
	}
	return "`" + strings.Join(cmds, " && ") + "`"
}

// cell makes text safe inside a markdown table cell: one line, pipes escaped (also inside
// code spans, as GitHub's tables require).
func cell(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	return strings.ReplaceAll(s, "|", `\|`)
}

// counts is the summary line: how many cases got each verdict.
func counts(rows []row) string {
	n := map[string]int{}
	for _, r := range rows {
		n[r.verdict]++
	}
	return fmt.Sprintf("%d cases: %d pass, %d fail, %d skipped, %d not built",
		len(rows), n[verdictPass], n[verdictFail], n[verdictSkipped], n[verdictNotBuilt])
}
