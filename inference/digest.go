package inference

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"strings"
)

// Digest identifies one complete output: the SHA-256 of its tokens in order, each encoded as
// its id (8 bytes, big-endian two's complement, so -1 for an unknown id), its text's length in
// bytes (8 bytes, big-endian) and the text. The lengths make the encoding unambiguous:
// different outputs never hash the same bytes. Sampled verification compares the digests of
// two executions of one request; a serving peer's receipt names the digest of what it sent.
type Digest [sha256.Size]byte

// String is "sha256:" and the digest in lowercase hex, the form receipts carry.
func (d Digest) String() string { return DigestPrefix + hex.EncodeToString(d[:]) }

// DigestPrefix starts the string form of a Digest.
const DigestPrefix = "sha256:"

// ParseDigest reads the string form of a Digest. Only the canonical form is accepted
// (lowercase hex, as String writes it and receipts require), so that a digest has one
// string form and comparing strings is comparing digests.
func ParseDigest(s string) (Digest, error) {
	var d Digest
	h, ok := strings.CutPrefix(s, DigestPrefix)
	if !ok || hex.DecodedLen(len(h)) != len(d) {
		return d, fmt.Errorf("digest %q is not %s and %d hex digits", s, DigestPrefix, 2*len(d))
	}
	if _, err := hex.Decode(d[:], []byte(h)); err != nil {
		return Digest{}, fmt.Errorf("digest %q: %w", s, err)
	}
	if d.String() != s {
		return Digest{}, fmt.Errorf("digest %q: hex digits must be lowercase", s)
	}
	return d, nil
}

// Digester computes a Digest as tokens arrive. The zero value is not usable: NewDigester.
type Digester struct {
	h   hash.Hash
	buf [16]byte
}

// NewDigester returns a Digester of the empty output.
func NewDigester() *Digester { return &Digester{h: sha256.New()} }

// Add appends tok to the output.
func (dg *Digester) Add(tok Token) {
	binary.BigEndian.PutUint64(dg.buf[:8], uint64(int64(tok.ID)))
	binary.BigEndian.PutUint64(dg.buf[8:], uint64(len(tok.Text)))
	dg.h.Write(dg.buf[:])
	io.WriteString(dg.h, tok.Text)
}

// Sum returns the digest of the tokens added so far.
func (dg *Digester) Sum() (d Digest) {
	dg.h.Sum(d[:0])
	return d
}

// DigestOf is the digest of a complete output.
func DigestOf(toks []Token) Digest {
	dg := NewDigester()
	for _, tok := range toks {
		dg.Add(tok)
	}
	return dg.Sum()
}
