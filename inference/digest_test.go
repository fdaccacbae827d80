package inference

import (
	"strings"
	"testing"
)

// The digest covers ids, texts and token boundaries: outputs that differ in any of them
// differ, and the same output hashes the same whether fed at once or token by token.
func TestDigest(t *testing.T) {
	out := []Token{{Index: 0, Text: "ab", ID: 1}, {Index: 1, Text: "c", ID: 2}}
	for name, other := range map[string][]Token{
		"boundary moved": {{Index: 0, Text: "a", ID: 1}, {Index: 1, Text: "bc", ID: 2}},
		"id changed":     {{Index: 0, Text: "ab", ID: 1}, {Index: 1, Text: "c", ID: 3}},
		"text changed":   {{Index: 0, Text: "ab", ID: 1}, {Index: 1, Text: "d", ID: 2}},
		"token missing":  {{Index: 0, Text: "ab", ID: 1}},
		"unknown id":     {{Index: 0, Text: "ab", ID: -1}, {Index: 1, Text: "c", ID: 2}},
	} {
		if DigestOf(other) == DigestOf(out) {
			t.Errorf("%s: same digest as the original", name)
		}
	}
	h := NewDigester()
	for _, tok := range out {
		h.Add(tok)
	}
	if h.Sum() != DigestOf(out) {
		t.Errorf("streamed digest differs from the digest of the whole output")
	}
}

// The string form is the one receipts carry: the prefix and 64 lowercase hex digits.
func TestDigestString(t *testing.T) {
	s := DigestOf(nil).String()
	// SHA-256 of no bytes.
	if want := "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"; s != want {
		t.Fatalf("empty output digest %q, want %q", s, want)
	}
	if !strings.HasPrefix(s, DigestPrefix) {
		t.Fatalf("%q lacks %q", s, DigestPrefix)
	}
}

// ParseDigest reads back the string form, and refuses anything else.
func TestParseDigest(t *testing.T) {
	d := DigestOf([]Token{{Index: 0, Text: "mesh", ID: 3}})
	if got, err := ParseDigest(d.String()); err != nil || got != d {
		t.Fatalf("ParseDigest(%s) = %v, %v", d, got, err)
	}
	for _, bad := range []string{"", "sha256:", d.String()[:70], "md5:" + d.String()[7:], d.String()[:70] + "zz"} {
		if _, err := ParseDigest(bad); err == nil {
			t.Errorf("ParseDigest(%q) accepted", bad)
		}
	}
}
