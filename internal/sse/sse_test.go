package sse

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
)

// readAll reads every payload of in with a Reader, and the error that ended it.
func readAll(in string, max int) ([]string, error) {
	r := NewReader(strings.NewReader(in), max)
	var got []string
	for {
		p, err := r.Next()
		if err != nil {
			return got, err
		}
		got = append(got, string(p))
	}
}

// splitAll feeds in to Split in pieces of n bytes (all at once for n ≤ 0), then ends the
// last line as Reader does at the end of its stream. Its error is Reader's: io.EOF at
// [DONE], ErrNoDone at the end without.
func splitAll(in []byte, n, max int) ([]string, error) {
	var (
		got  []string
		buf  []byte
		keep = func(p []byte) bool { got = append(got, string(p)); return true }
	)
	for len(in) > 0 {
		k := len(in)
		if n > 0 {
			k = min(k, n)
		}
		buf = append(buf, in[:k]...)
		in = in[k:]
		rest, err := Split(buf, max, keep)
		if err != nil {
			return got, err
		}
		buf = append([]byte(nil), rest...)
	}
	if len(buf) > 0 {
		if _, err := Split(append(buf, '\n'), max, keep); err != nil {
			return got, err
		}
	}
	return got, ErrNoDone
}

func TestReader(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want []string
		err  error
	}{
		{"empty", "", nil, ErrNoDone},
		{"events and done", "data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n", []string{`{"a":1}`, `{"b":2}`}, io.EOF},
		{"no space, CRLF", "data:{}\r\n\r\ndata:[DONE]\r\n", []string{`{}`}, io.EOF},
		{"only one space is the separator", "data:  x\n", []string{" x"}, ErrNoDone},
		{"done with spaces", "data:  [DONE] \n", nil, io.EOF},
		{"nothing read after done", "data: [DONE]\ndata: {}\n", nil, io.EOF},
		{"other fields and comments", ": keep-alive\nevent: x\nid: 1\nretry: 5\n\ndata: 1\n", []string{"1"}, ErrNoDone},
		{"multi-line data: one event a line", "data: a\ndata: b\n\n", []string{"a", "b"}, ErrNoDone},
		{"not quite data", "Data: x\ndata x\n data: x\n", nil, ErrNoDone},
		{"empty payload", "data:\n", []string{""}, ErrNoDone},
		{"unended last line", "data: 1\ndata: 2", []string{"1", "2"}, ErrNoDone},
		{"longest line", "data: " + strings.Repeat("x", 25) + "\n", []string{strings.Repeat("x", 25)}, ErrNoDone},
		{"too long by one", "data: 1\ndata: " + strings.Repeat("x", 26) + "\ndata: 2\n", []string{"1"}, ErrTooLong},
		{"too long, unended", "data: " + strings.Repeat("x", 40), nil, ErrTooLong},
	}
	for _, tc := range cases {
		for _, form := range []string{"Reader", "Split"} {
			var (
				got []string
				err error
			)
			if form == "Reader" {
				got, err = readAll(tc.in, 32)
			} else {
				got, err = splitAll([]byte(tc.in), 3, 32)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) || !errors.Is(err, tc.err) {
				t.Errorf("%s, %s: %q, %v; want %q, %v", tc.name, form, got, err, tc.want, tc.err)
			}
		}
	}
}

// Split stops where fn says, and leaves the rest; after [DONE] nothing is left.
func TestSplitStops(t *testing.T) {
	buf := []byte("data: 1\ndata: 2\ndata: 3")
	rest, err := Split(buf, 64, func([]byte) bool { return false })
	if err != nil || string(rest) != "data: 2\ndata: 3" {
		t.Fatalf("Split = %q, %v", rest, err)
	}
	rest, err = Split([]byte("data: [DONE]\n\ndata: 4\n"), 64, func([]byte) bool { return true })
	if err != io.EOF || rest != nil {
		t.Fatalf("Split at [DONE] = %q, %v", rest, err)
	}
}

// errAfter fails the read after its content.
type errAfter struct{ r io.Reader }

func (e errAfter) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func TestReaderReadError(t *testing.T) {
	r := NewReader(errAfter{strings.NewReader("data: 1\n")}, 64)
	if p, err := r.Next(); err != nil || string(p) != "1" {
		t.Fatalf("first: %q, %v", p, err)
	}
	if _, err := r.Next(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a broken stream gave %v", err)
	}
}

// FuzzReaderSplit: for any bytes and any way of cutting them into writes, Reader and Split
// give the same payloads and end the same way, and no payload holds a line end or reaches
// the maximum.
func FuzzReaderSplit(f *testing.F) {
	f.Add([]byte("data: {\"a\":1}\n\ndata: [DONE]\n\n"), 3, 32)
	f.Add([]byte("data:{}\r\n: c\r\ndata:[DONE]\r\n"), 1, 16)
	f.Add([]byte("data: "+strings.Repeat("x", 40)+"\ndata: 1\n"), 7, 32)
	f.Add([]byte("data: x\r\r\ndata: y\r"), 0, 20)
	f.Add([]byte{}, 0, 0)
	f.Fuzz(func(t *testing.T, in []byte, chunk, max int) {
		max = 8 + int(uint(max)%128)
		got, err := readAll(string(in), max)
		for _, p := range got {
			if strings.ContainsRune(p, '\n') || len(p) >= max {
				t.Fatalf("payload %q (max %d)", p, max)
			}
		}
		pushed, perr := splitAll(in, int(uint(chunk)%64), max)
		if fmt.Sprint(got) != fmt.Sprint(pushed) || !errors.Is(perr, ErrTooLong) && !errors.Is(err, perr) ||
			errors.Is(err, ErrTooLong) != errors.Is(perr, ErrTooLong) {
			t.Fatalf("Reader: %q, %v; Split: %q, %v", got, err, pushed, perr)
		}
	})
}
