package jsonlog

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// scanned is what Scan passed for one line.
type scanned struct {
	n    int
	line string
	err  error
}

func scanAll(t *testing.T, in string, max int) []scanned {
	t.Helper()
	var got []scanned
	err := Scan(strings.NewReader(in), max, func(n int, line []byte, err error) bool {
		got = append(got, scanned{n, string(line), err})
		return true
	})
	if err != nil {
		t.Fatalf("Scan(%q): %v", in, err)
	}
	return got
}

func TestScan(t *testing.T) {
	long := strings.Repeat("x", 40)
	cases := []struct {
		name string
		in   string
		want []scanned
	}{
		{"empty", "", nil},
		{"one line", "{}\n", []scanned{{1, "{}", nil}}},
		{"no final newline (torn)", "{}\n{\"a\"", []scanned{{1, "{}", nil}, {2, `{"a"`, nil}}},
		{"empty lines keep their number", "\n{}\n\n[]\n", []scanned{{2, "{}", nil}, {4, "[]", nil}}},
		{"longest line", strings.Repeat("y", 31) + "\n", []scanned{{1, strings.Repeat("y", 31), nil}}},
		{"too long by one", strings.Repeat("y", 32) + "\n{}\n", []scanned{{1, "", ErrTooLong}, {2, "{}", nil}}},
		{"too long at the end", "{}\n" + long, []scanned{{1, "{}", nil}, {2, "", ErrTooLong}}},
		{"too long, many buffers", "{}\n" + strings.Repeat(long, 10) + "\n1\n", []scanned{{1, "{}", nil}, {2, "", ErrTooLong}, {3, "1", nil}}},
	}
	for _, tc := range cases {
		got := scanAll(t, tc.in, 32)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestScanStops(t *testing.T) {
	calls := 0
	err := Scan(strings.NewReader("1\n2\n3\n"), 32, func(int, []byte, error) bool {
		calls++
		return false
	})
	if err != nil || calls != 1 {
		t.Fatalf("Scan = %v after %d calls; want nil after 1", err, calls)
	}
}

// errReader fails after its content.
type errReader struct{ s *strings.Reader }

func (r errReader) Read(p []byte) (int, error) {
	if r.s.Len() == 0 {
		return 0, errors.New("disk on fire")
	}
	return r.s.Read(p)
}

func TestScanReadError(t *testing.T) {
	if err := Scan(errReader{strings.NewReader("1\n2")}, 32, func(int, []byte, error) bool { return true }); err == nil {
		t.Fatal("a read error was swallowed")
	}
}

func line(s string) func() ([]byte, error) {
	return func() ([]byte, error) { return []byte(s + "\n"), nil }
}

func TestAppend(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "log.jsonl")
	l, err := Open(path, 16, nil)
	if err != nil {
		t.Fatal(err)
	}
	written := 0
	for _, s := range []string{`{"a":1}`, `{"b":2}`} {
		if err := l.Append(line(s), func() { written++ }); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name string
		line func() ([]byte, error)
		want error
	}{
		{"over the maximum", line(strings.Repeat("z", 16)), ErrTooLong},
		{"line's own error", func() ([]byte, error) { return nil, os.ErrInvalid }, os.ErrInvalid},
	}
	for _, tc := range cases {
		if err := l.Append(tc.line, func() { written++ }); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if written != 2 {
		t.Errorf("written called %d times, want 2", written)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := l.Append(line("{}"), nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Append after Close: %v", err)
	}
	data, err := os.ReadFile(path)
	if err != nil || string(data) != "{\"a\":1}\n{\"b\":2}\n" {
		t.Fatalf("file holds %q, %v", data, err)
	}
	for p, mode := range map[string]os.FileMode{path: 0o600, filepath.Dir(path): 0o700} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, %v; want %v", p, fi.Mode().Perm(), err, mode)
		}
	}
}

// A file that ends inside a line (a crash mid-write) gets its next line on a fresh line, and
// Opened replays what was there.
func TestReopenTorn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log.jsonl")
	if err := os.WriteFile(path, []byte("{\"a\":1}\n{\"b\""), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := Open(path, 64, nil)
	if err != nil {
		t.Fatal(err)
	}
	var replayed []string
	if err := Scan(l.Opened(), 64, func(_ int, line []byte, _ error) bool {
		replayed = append(replayed, string(line))
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if err := l.Append(line(`{"c":3}`), nil); err != nil {
		t.Fatal(err)
	}
	l.Close()
	data, _ := os.ReadFile(path)
	if string(data) != "{\"a\":1}\n{\"b\"\n{\"c\":3}\n" {
		t.Fatalf("file holds %q", data)
	}
	if fmt.Sprint(replayed) != `[{"a":1} {"b"]` {
		t.Fatalf("replayed %q", replayed)
	}
}

func TestOpenRefusesNonRegular(t *testing.T) {
	dir := t.TempDir()
	if _, err := Open(dir, 64, nil); err == nil {
		t.Fatal("opened a directory as a log")
	}
}

// Concurrent Appends never interleave, and written runs in file order.
func TestAppendConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log.jsonl")
	l, err := Open(path, 64, nil)
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg   sync.WaitGroup
		seq  int // guarded by l's lock through line and written
		last int
	)
	for range 50 {
		wg.Go(func() {
			var mine int
			err := l.Append(func() ([]byte, error) {
				mine = seq + 1
				return fmt.Appendf(nil, "{\"seq\":%d}\n", mine), nil
			}, func() { seq = mine })
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	l.Close()
	data, _ := os.ReadFile(path)
	for i, ln := range bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n")) {
		if _, err := fmt.Sscanf(string(ln), "{\"seq\":%d}", &last); err != nil || last != i+1 {
			t.Fatalf("line %d is %q", i+1, ln)
		}
	}
	if last != 50 {
		t.Fatalf("%d lines, want 50", last)
	}
}

// FuzzScan: whatever the file holds, Scan never panics, passes lines without newlines and
// under the maximum in increasing order, and what it passes is in the input.
func FuzzScan(f *testing.F) {
	f.Add([]byte("{}\n{\"a\":1}\n"), 8)
	f.Add([]byte("\n\n{\"torn\""), 4)
	f.Add([]byte(strings.Repeat("x", 100)+"\n{}"), 16)
	f.Add([]byte{}, 0)
	f.Fuzz(func(t *testing.T, in []byte, max int) {
		max = 16 + abs(max)%256
		prev := 0
		err := Scan(bytes.NewReader(in), max, func(n int, line []byte, err error) bool {
			if n <= prev {
				t.Fatalf("line %d after %d", n, prev)
			}
			prev = n
			switch {
			case err != nil && (!errors.Is(err, ErrTooLong) || line != nil):
				t.Fatalf("line %d: %q, %v", n, line, err)
			case err == nil && (len(line) == 0 || len(line) >= max || bytes.IndexByte(line, '\n') >= 0):
				t.Fatalf("line %d of %d bytes (max %d): %q", n, len(line), max, line)
			case err == nil && !bytes.Contains(in, line):
				t.Fatalf("line %d %q is not in the input", n, line)
			}
			return true
		})
		if err != nil {
			t.Fatalf("Scan of a bytes.Reader: %v", err)
		}
		if lines := bytes.Count(in, []byte("\n")) + 1; prev > lines {
			t.Fatalf("line %d of an input of %d lines", prev, lines)
		}
	})
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// AppendAll writes its lines in order and stops at the first that fails, keeping the ones
// before it; written is called for exactly the lines written.
func TestAppendAll(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log.jsonl")
	l, err := Open(path, 16, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lines := []string{`{"a":1}`, `{"b":2}`, strings.Repeat("z", 16), `{"c":3}`}
	var written []int
	err = l.AppendAll(len(lines), func(i int) ([]byte, error) { return line(lines[i])() },
		func(i int) { written = append(written, i) })
	if !errors.Is(err, ErrTooLong) || !slices.Equal(written, []int{0, 1}) {
		t.Fatalf("AppendAll: %v, written %v; want ErrTooLong after lines 0 and 1", err, written)
	}
	if err := l.AppendAll(1, func(int) ([]byte, error) { return line(`{"d":4}`)() }, func(int) {}); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(path); err != nil || string(data) != "{\"a\":1}\n{\"b\":2}\n{\"d\":4}\n" {
		t.Fatalf("file holds %q, %v", data, err)
	}
}
