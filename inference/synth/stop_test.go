package synth

import (
	"strings"
	"testing"

	"github.com/meshinfer/meshinfer/inference"
)

// TestStopper feeds pieces through the stop filter and checks what comes out, step by step.
func TestStopper(t *testing.T) {
	tests := []struct {
		name    string
		stops   []string
		pieces  []string
		emitted []string // texts emitted after each piece, joined with "|"
		stopAt  int      // index of the piece that ends the completion, or -1
		flushed string   // texts released by flush at the end (when stopAt < 0)
	}{
		{"no stops", nil, []string{"ab", "cd"}, []string{"ab", "cd"}, -1, ""},
		{"inside one token", []string{"X"}, []string{"ab", "cXd"}, []string{"ab", "c"}, 1, ""},
		{"at token start", []string{"X"}, []string{"ab", "Xd"}, []string{"ab", ""}, 1, ""},
		{"across tokens", []string{"bcd"}, []string{"ab", "c", "de"}, []string{"", "", "a"}, 2, ""},
		{"held then released", []string{"bcd"}, []string{"ab", "c", "x", "y"}, []string{"", "", "ab|c|x", "y"}, -1, ""},
		{"held until flush", []string{"bcd"}, []string{"ab", "c"}, []string{"", ""}, -1, "ab|c"},
		{"earliest start wins", []string{"cd", "abcde"}, []string{"ab", "cde"}, []string{"", ""}, 1, ""},
		{"earlier of two", []string{"de", "cd"}, []string{"ab", "cde"}, []string{"ab", ""}, 1, ""},
		{"first completed wins", []string{"abcd", "c"}, []string{"ab", "c"}, []string{"", "ab"}, 1, ""},
		{"repeat prefix", []string{"aab"}, []string{"a", "a", "a", "b"}, []string{"", "", "a", ""}, 3, ""},
	}
	for _, tt := range tests {
		s := newStopper(tt.stops)
		var all []inference.Token
		stopped := -1
		for i, p := range tt.pieces {
			ready, stop := s.push(100+i, p)
			all = append(all, ready...)
			if got := joinTexts(ready); got != tt.emitted[i] {
				t.Errorf("%s: after %q emitted %q, want %q", tt.name, p, got, tt.emitted[i])
			}
			if stop {
				stopped = i
				break
			}
		}
		if stopped != tt.stopAt {
			t.Errorf("%s: stopped at %d, want %d", tt.name, stopped, tt.stopAt)
		}
		if stopped < 0 {
			rest := s.flush()
			all = append(all, rest...)
			if got := joinTexts(rest); got != tt.flushed {
				t.Errorf("%s: flush %q, want %q", tt.name, got, tt.flushed)
			}
		}
		for i, tok := range all {
			if tok.Index != i || tok.Text == "" || tok.ID < 100 {
				t.Errorf("%s: token %d is %+v", tt.name, i, tok)
			}
		}
	}
}

func joinTexts(toks []inference.Token) string {
	var parts []string
	for _, tok := range toks {
		parts = append(parts, tok.Text)
	}
	return strings.Join(parts, "|")
}
