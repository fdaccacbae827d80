package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every case of the catalogue is in the table once; a case runs tests or says what is
// missing; every test it names exists in its package, so a renamed test fails here and
// not only as "did not report" in a 20-minute run.
func TestCasesNameExistingTests(t *testing.T) {
	cases := Cases()
	if len(cases) != 37 {
		t.Errorf("%d cases, want 37", len(cases))
	}
	id := regexp.MustCompile(`^(L[1-6]|F([1-9]|1[0-9])|Z([1-9]|1[0-2]))$`)
	seen := map[string]bool{}
	for _, c := range cases {
		if !id.MatchString(c.ID) || seen[c.ID] {
			t.Errorf("case id %q: not in the catalogue's numbering, or twice", c.ID)
		}
		seen[c.ID] = true
		if c.Goal == "" || (len(c.Runs) == 0) == (c.Missing == "") {
			t.Errorf("%s: needs a goal, and either runs or what is missing", c.ID)
		}
		for _, r := range c.Runs {
			if r.Timeout <= 0 || len(r.Tests) == 0 {
				t.Errorf("%s: run of %s without tests or timeout", c.ID, r.Pkg)
			}
			src := testSources(t, filepath.Join("..", "..", r.Pkg))
			for _, name := range r.Tests {
				if !strings.Contains(src, "func "+name+"(") {
					t.Errorf("%s: no %s in %s", c.ID, name, r.Pkg)
				}
			}
		}
	}
}

func testSources(t *testing.T, dir string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files in %s: %v", dir, err)
	}
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(data)
	}
	return b.String()
}

// go test -json output as cmd/test2json writes it (trimmed to the fields used).
const events = `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"output","Package":"p","Test":"TestA","Output":"    a_test.go:10: figure F4: first\n"}
{"Action":"output","Package":"p","Test":"TestA","Output":"    a_test.go:11: figure F4: cut at 5.0 s\n"}
{"Action":"output","Package":"p","Test":"TestA","Output":"    a_test.go:12: figure F9: other case\n"}
{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"run","Package":"p","Test":"TestB"}
{"Action":"output","Package":"p","Test":"TestB/tcp","Output":"    b_test.go:20: figure F4: tcp 47 ms\n"}
{"Action":"pass","Package":"p","Test":"TestB/tcp"}
{"Action":"output","Package":"p","Test":"TestB/quic","Output":"    b_test.go:21: got 3, want 2\n"}
{"Action":"output","Package":"p","Test":"TestB/quic","Output":"    --- FAIL: TestB/quic (0.01s)\n"}
{"Action":"fail","Package":"p","Test":"TestB/quic"}
{"Action":"fail","Package":"p","Test":"TestB"}
{"Action":"output","Package":"p","Test":"TestC","Output":"    c_test.go:5: no non-loopback address\n"}
{"Action":"skip","Package":"p","Test":"TestC"}
{"Action":"output","Package":"p","Output":"FAIL\n"}
{"Action":"fail","Package":"p"}
`

func TestParseAndJudge(t *testing.T) {
	res, err := parse(strings.NewReader(events))
	if err != nil {
		t.Fatal(err)
	}
	results := map[string]*result{groupKey("./p/", "", true): res}
	judgeOf := func(tests ...string) row {
		return judge(Case{ID: "F4", Runs: []Run{race("./p/", short, tests...)}}, results, nil)
	}
	for _, tt := range []struct {
		tests         []string
		verdict, figs string
	}{
		// The last figure line of the case's id, per test: another case's is left out.
		{[]string{"TestA"}, verdictPass, "cut at 5.0 s"},
		{[]string{"TestA", "TestB"}, verdictFail, "TestB: got 3, want 2"},
		{[]string{"TestA", "TestC"}, verdictSkipped, "TestC: no non-loopback address"},
		{[]string{"TestMissing"}, verdictFail, "TestMissing did not report"},
	} {
		r := judgeOf(tt.tests...)
		if r.verdict != tt.verdict || r.figure != tt.figs {
			t.Errorf("%v: %s %q, want %s %q", tt.tests, r.verdict, r.figure, tt.verdict, tt.figs)
		}
	}
	// A subtest's figure is named by its subtest.
	if f := res.Tests["TestB"].Figures; len(f) != 1 || f[0].Test != "TestB/tcp" {
		t.Errorf("TestB figures %+v", f)
	}
	if r := judge(Case{ID: "L4", Missing: "no soak"}, results, nil); r.verdict != verdictNotBuilt {
		t.Errorf("case without runs: %s", r.verdict)
	}
}

// Table cells stay on one line, with their pipes escaped (the -run regexps have some).
func TestCommandIsOneCell(t *testing.T) {
	c := Case{ID: "F4", Runs: []Run{race("./transport/", short, "TestA", "TestB"), {Pkg: "./x/", Tests: []string{"TestC"}, Tags: "soak", Timeout: long}}}
	got := cell(command(c))
	want := "`go test -race -count=1 -timeout 2m0s -run '^(TestA\\|TestB)$' ./transport/ && go test -tags soak -count=1 -timeout 10m0s -run '^(TestC)$' ./x/`"
	if got != want {
		t.Errorf("command\n%s\nwant\n%s", got, want)
	}
}

// TestMakeFuzzRunsEveryTarget: `make fuzz` (the Makefile's FUZZ_TARGETS) fuzzes every fuzz
// target in the repository, and names none that does not exist: a target added without
// its line would only ever run its seeds.
func TestMakeFuzzRunsEveryTarget(t *testing.T) {
	root := filepath.Join("..", "..")
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile(`\./([\w/]*?)/?:(Fuzz\w+)`).FindAllStringSubmatch(string(mk), -1) {
		listed[m[1]+":"+m[2]] = true
	}
	if len(listed) == 0 {
		t.Fatal("no FUZZ_TARGETS in the Makefile")
	}
	fuzz := regexp.MustCompile(`(?m)^func (Fuzz\w+)\(`)
	found := map[string]bool{}
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		dir, _ := filepath.Rel(root, filepath.Dir(path))
		for _, m := range fuzz.FindAllStringSubmatch(string(src), -1) {
			found[filepath.ToSlash(dir)+":"+m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for k := range found {
		if !listed[k] {
			t.Errorf("fuzz target %s is not in the Makefile's FUZZ_TARGETS", k)
		}
	}
	for k := range listed {
		if !found[k] {
			t.Errorf("FUZZ_TARGETS names %s, which does not exist", k)
		}
	}
}
