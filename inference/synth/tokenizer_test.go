package synth

import (
	"testing"

	"github.com/meshinfer/meshinfer/inference"
)

func TestTokenizerRoundTrip(t *testing.T) {
	tok := newTokenizer(4096)
	for _, s := range []string{
		"", "a", "Hello, world!", " the quick brown fox\njumps", "naïve café 日本語 😀",
		"\x00\x01\xff\xfe binary", "thoung bre kai", "babababababababababababababa",
	} {
		ids := tok.encode(nil, s, 1<<20)
		if got := tok.decode(ids); got != s {
			t.Errorf("decode(encode(%q)) = %q", s, got)
		}
		if len(s) > 8 && len(ids) >= len(s) {
			t.Errorf("encode(%q) gave %d tokens for %d bytes: syllables unused", s, len(ids), len(s))
		}
	}
	if got := tok.encode(nil, "xxxxxxxxxx", 3); len(got) != 4 {
		t.Errorf("encode with limit 3 gave %d tokens, want 4 (stop once over)", len(got))
	}
}

func TestTokenizerVocabulary(t *testing.T) {
	for _, vocab := range []int{idSyllableBase + 1, 512, 2048, idSyllableBase + syllableCapacity} {
		tok := newTokenizer(vocab)
		seen := map[string]int{}
		for id := idByteBase; id < vocab; id++ {
			piece := tok.pieces[id]
			if prev, dup := seen[piece]; dup {
				t.Fatalf("vocab %d: ids %d and %d are both %q", vocab, prev, id, piece)
			}
			seen[piece] = id
			if id >= idSyllableBase && (len(piece) < 2 || len(piece) > maxPieceLen || tok.lookup[piece] != id) {
				t.Fatalf("vocab %d: syllable %d is %q", vocab, id, piece)
			}
		}
		for id, ok := range tok.sampleable {
			if !ok {
				continue
			}
			for _, c := range []byte(tok.pieces[id]) {
				if c != '\n' && (c < 0x20 || c >= 0x7f) {
					t.Fatalf("vocab %d: sampleable token %d has byte %#x", vocab, id, c)
				}
			}
		}
		for id := idRoleBase; id < idByteBase; id++ {
			if tok.sampleable[id] {
				t.Errorf("role marker %d is sampleable", id)
			}
		}
	}
}

func TestChatTemplate(t *testing.T) {
	tok := newTokenizer(512)
	got := tok.encodeChat([]inference.Message{
		{Role: inference.RoleSystem, Content: "\x01"},
		{Role: inference.RoleDeveloper},
		{Role: inference.RoleUser, Content: "\x02"},
		{Role: inference.RoleAssistant, Content: "\x03"},
	}, 100)
	want := []int{1, idByteBase + 1, 2, 3, idByteBase + 2, 4, idByteBase + 3, 4}
	if len(got) != len(want) {
		t.Fatalf("template %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("template %v, want %v", got, want)
		}
	}
}
