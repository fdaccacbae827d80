package inference

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// FuzzRequestJSON: decoding any bytes into a Request and validating it never panics; a
// request that validates survives an encode/decode round trip unchanged, and still validates.
func FuzzRequestJSON(f *testing.F) {
	for _, seed := range []string{
		`{"model":"synth-tiny","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"system","content":null},{"role":"user","content":[{"type":"text","text":"a"}]}],"max_tokens":5,"temperature":0,"top_p":1,"seed":42,"stop":"x","stream":true}`,
		`{"model":"m","messages":[{"role":"user","content":"\u00e9\ud83d\ude00"}],"stop":["a","b"],"max_completion_tokens":3}`,
		`{"model":"m","messages":[],"max_tokens":-1,"temperature":3,"top_p":0}`,
		`{"model":"m","messages":[{"role":"tool","content":"x"}],"stop":["","b","c","d","e"]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"seed":9223372036854775807,"temperature":1e-320}`,
		`[]`, `null`, `{"messages":null}`, `{"stop":[]}`, "",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var r Request
		if err := json.Unmarshal(data, &r); err != nil {
			return
		}
		if err := r.Validate(Limits{}); err != nil {
			if CodeOf(err) != CodeInvalidRequest {
				t.Fatalf("Validate returned %v, not an invalid_request error", err)
			}
			return
		}
		enc, err := json.Marshal(&r)
		if err != nil {
			t.Fatalf("Marshal of a valid request: %v", err)
		}
		var back Request
		if err := json.Unmarshal(enc, &back); err != nil {
			t.Fatalf("Unmarshal(%s): %v", enc, err)
		}
		if !reflect.DeepEqual(r, back) {
			t.Fatalf("round trip changed the request:\n%+v\n%+v\nvia %s", r, back, enc)
		}
		if err := back.Validate(Limits{}); err != nil {
			t.Fatalf("round-tripped request no longer validates: %v", err)
		}
	})
}

// tokensFrom reads a fuzzer's bytes as an output: each token is a 2-byte id (signed, so -1,
// unknown, occurs), a length byte and that many bytes of text (fewer at the end). Index is
// set to junk: a digest must not depend on it.
func tokensFrom(b []byte) []Token {
	var toks []Token
	for len(b) >= 3 {
		id := int(int16(uint16(b[0])<<8 | uint16(b[1])))
		n := min(int(b[2]), len(b)-3)
		toks = append(toks, Token{Index: len(b) * 7, ID: id, Text: string(b[3 : 3+n])})
		b = b[3+n:]
	}
	return toks
}

// sameOutput reports whether two outputs are the same for a digest: ids and texts in order.
func sameOutput(a, b []Token) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].ID != b[i].ID || a[i].Text != b[i].Text {
			return false
		}
	}
	return true
}

// FuzzDigest (Z7, result hashing): two outputs hash the same exactly when their ids and
// texts are the same in order, whatever their indices, so neither a moved token boundary nor
// a changed id goes unnoticed; a digest streamed token by token, with Sum read between
// tokens, equals the digest of the whole output; and its string form is canonical.
func FuzzDigest(f *testing.F) {
	f.Add([]byte("\x00\x01\x02ab\x00\x02\x01c"), []byte("\x00\x01\x01a\x00\x02\x02bc"))       // a boundary moved
	f.Add([]byte("\x00\x01\x02ab\x00\x02\x01c"), []byte("\x00\x01\x02ab\x00\x03\x01c"))       // an id changed
	f.Add([]byte("\xff\xff\x05hello\x00\x07\x01 "), []byte("\xff\xff\x05hello\x00\x07\x01 ")) // the same, unknown ids
	f.Add([]byte{}, []byte("\x00\x00\x00"))                                                   // nothing, and an empty token
	f.Add([]byte("\x01\x00\x04mesh\x00\x00\x04mesh"), []byte("\x00\x00\x04mesh\x01\x00\x04mesh"))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		ta, tb := tokensFrom(a), tokensFrom(b)
		da, db := DigestOf(ta), DigestOf(tb)
		if (da == db) != sameOutput(ta, tb) {
			t.Fatalf("outputs %+v and %+v: digests equal %v, outputs equal %v", ta, tb, da == db, sameOutput(ta, tb))
		}
		dg := NewDigester()
		for i, tok := range ta {
			tok.Index = -i // indices are not part of the output's identity
			dg.Add(tok)
			if dg.Sum() != DigestOf(ta[:i+1]) {
				t.Fatalf("streamed digest of %d tokens differs from the whole's", i+1)
			}
		}
		if dg.Sum() != da {
			t.Fatal("streamed digest differs from the whole output's")
		}
		s := da.String()
		if back, err := ParseDigest(s); err != nil || back != da {
			t.Fatalf("ParseDigest(%s) = %v, %v", s, back, err)
		}
	})
}

// FuzzParseDigest: parsing any string never panics, and a string it accepts is the canonical
// form of what it returns; anything else is refused with the zero digest.
func FuzzParseDigest(f *testing.F) {
	d := DigestOf([]Token{{Text: "mesh", ID: 3}})
	f.Add(d.String())
	f.Add(strings.ToUpper(d.String()))
	f.Add("sha256:" + strings.ToUpper(d.String()[7:]))
	f.Add(d.String()[:70])
	f.Add(d.String() + "0")
	f.Add("md5:" + d.String()[7:])
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseDigest(s)
		if err != nil {
			if got != (Digest{}) {
				t.Fatalf("ParseDigest(%q) refused it but returned %v", s, got)
			}
			return
		}
		if got.String() != s {
			t.Fatalf("ParseDigest(%q) accepted a form other than the canonical %s", s, got)
		}
	})
}
