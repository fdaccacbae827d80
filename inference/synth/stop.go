package synth

import (
	"bytes"
	"strings"

	"github.com/meshinfer/meshinfer/inference"
)

// stopper turns generated tokens into emitted ones, applying stop strings with OpenAI's
// semantics: the completion ends at the first point where any stop string appears in the
// generated text (the prompt is not searched), and the text returned ends just before that
// occurrence. When several stop strings appear at that point, the one that starts earliest
// wins. To never emit text that a stop string later swallows, a token whose text could be
// the start of a stop string is held back until the next tokens decide; held tokens are
// released when generation ends for another reason.
type stopper struct {
	stops  []string
	maxLen int // longest stop string, in bytes

	text     []byte       // all generated text
	pending  []pendingTok // tokens not yet emitted, in order
	released int          // bytes of text already emitted
	next     int          // Index of the next emitted token
	out      []inference.Token
}

type pendingTok struct {
	id         int
	start, end int // byte range in text
}

func newStopper(stops []string) *stopper {
	s := &stopper{stops: stops}
	for _, st := range stops {
		s.maxLen = max(s.maxLen, len(st))
	}
	return s
}

// push adds a generated token. It returns the tokens now safe to emit (valid until the next
// call) and whether a stop string has ended the completion.
func (s *stopper) push(id int, piece string) ([]inference.Token, bool) {
	start := len(s.text)
	s.text = append(s.text, piece...)
	s.pending = append(s.pending, pendingTok{id: id, start: start, end: len(s.text)})
	if len(s.stops) == 0 {
		return s.release(len(s.text)), false
	}
	// A match new with this token ends inside it, so it starts at most maxLen−1 bytes
	// before it; anything earlier would have matched before.
	from := max(s.released, start-s.maxLen+1)
	at := -1
	for _, st := range s.stops {
		if i := bytes.Index(s.text[from:], []byte(st)); i >= 0 && (at < 0 || from+i < at) {
			at = from + i
		}
	}
	if at >= 0 {
		return s.release(at), true
	}
	// Hold back from the first position whose suffix could still grow into a stop string.
	hold := len(s.text)
	for h := max(s.released, len(s.text)-s.maxLen+1); h < len(s.text); h++ {
		if s.couldStart(s.text[h:]) {
			hold = h
			break
		}
	}
	return s.releaseWhole(hold), false
}

// couldStart reports whether tail is a proper prefix of some stop string.
func (s *stopper) couldStart(tail []byte) bool {
	for _, st := range s.stops {
		if len(tail) < len(st) && strings.HasPrefix(st, string(tail)) {
			return true
		}
	}
	return false
}

// flush releases every held token: generation ended without a stop string.
func (s *stopper) flush() []inference.Token {
	return s.release(len(s.text))
}

// release emits the text before limit: whole tokens, and the part of the token that
// straddles limit. Tokens past limit are dropped.
func (s *stopper) release(limit int) []inference.Token {
	s.out = s.out[:0]
	for _, t := range s.pending {
		end := min(t.end, limit)
		if end > t.start {
			s.emit(t.id, string(s.text[t.start:end]))
		}
	}
	s.pending = s.pending[:0]
	s.released = max(s.released, limit)
	return s.out
}

// releaseWhole emits the pending tokens that end at or before limit.
func (s *stopper) releaseWhole(limit int) []inference.Token {
	s.out = s.out[:0]
	n := 0
	for n < len(s.pending) && s.pending[n].end <= limit {
		t := s.pending[n]
		s.emit(t.id, string(s.text[t.start:t.end]))
		s.released = t.end
		n++
	}
	s.pending = append(s.pending[:0], s.pending[n:]...)
	return s.out
}

func (s *stopper) emit(id int, text string) {
	s.out = append(s.out, inference.Token{Index: s.next, Text: text, ID: id})
	s.next++
}
