package caps

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

// FuzzDecode feeds arbitrary bytes to Decode and Verify (docs/reliability.md F9: no input may
// panic). Whatever Decode accepts must be within bounds, encodable, and survive
// Decode(Encode(v)) unchanged.
func FuzzDecode(f *testing.F) {
	valid := marshal(f, signedVector(f, seededKey(f, 7), nil))
	f.Add(valid)
	f.Add([]byte(""))
	f.Add([]byte("null"))
	f.Add([]byte("{}"))
	f.Add([]byte("[]"))
	f.Add([]byte(`{"peer_id":""}`))
	f.Add([]byte(strings.Repeat("[", 10_000)))
	f.Add(pad(valid, MaxEncodedSize))
	f.Add(bytes.ToUpper(valid))
	f.Add([]byte(caps1Wire))
	f.Add(marshal(f, signedVector(f, seededKey(f, 7), func(v *Vector) { *v = *mobileVector(testNow()) })))
	f.Add(marshal(f, signedVector(f, seededKey(f, 7), func(v *Vector) {
		v.Stages = []Stage{{Model: v.Models[0].Name, Lo: 0, Hi: 8, State: StageLoading}, {Model: v.Models[1].Name, Lo: 8, Hi: 16, State: StageWarm}}
	})))
	for _, fg := range forgeries(f, newForgeryKeys(f, false)) {
		if len(fg.data) <= MaxEncodedSize+1 {
			f.Add(fg.data)
		}
	}
	now := testNow()
	f.Fuzz(func(t *testing.T, data []byte) {
		v, decErr := Decode(data)
		got, verErr := Verify(data, now)
		if decErr != nil {
			if s := sentinelOf(decErr); s != ErrTooLarge && s != ErrMalformed && s != ErrOutOfBounds {
				t.Fatalf("Decode = %v, not ErrTooLarge, ErrMalformed or ErrOutOfBounds", decErr)
			}
			if v != nil {
				t.Fatalf("Decode returned a vector with error %v", decErr)
			}
			if verErr == nil || sentinelOf(verErr) != sentinelOf(decErr) {
				t.Fatalf("Decode = %v but Verify = %v", decErr, verErr)
			}
			return
		}
		if err := v.Validate(); err != nil {
			t.Fatalf("Decode accepted a vector that does not validate: %v", err)
		}
		if verErr != nil {
			if s := sentinelOf(verErr); s != ErrBadSignature && s != ErrExpired && s != ErrClockSkew {
				t.Fatalf("Verify of a decodable vector = %v, want a signature or time error", verErr)
			}
			if got != nil {
				t.Fatalf("Verify returned a vector with error %v", verErr)
			}
		} else if !reflect.DeepEqual(got, v) {
			t.Fatalf("Verify returned %+v, Decode %+v", got, v)
		}
		enc, err := Encode(v)
		if err != nil {
			t.Fatalf("Encode of a decoded vector: %v", err)
		}
		v2, err := Decode(enc)
		if err != nil {
			t.Fatalf("Decode(Encode(v)): %v\n%s", err, enc)
		}
		if !reflect.DeepEqual(normalized(v2), normalized(v)) {
			t.Fatalf("Decode(Encode(v)) =\n%+v\nwant\n%+v", v2, v)
		}
		if !bytes.Equal(canonical(t, v2), canonical(t, v)) {
			t.Fatalf("canonical bytes changed by a round trip:\n%s\n%s", canonical(t, v2), canonical(t, v))
		}
		if enc2, err := Encode(v2); err != nil || !bytes.Equal(enc2, enc) {
			t.Fatalf("Encode is not stable: %v\n%s\n%s", err, enc2, enc)
		}
		if verErr == nil {
			if _, err := Verify(enc, now); err != nil {
				t.Fatalf("Verify(Encode(Verify(data))) = %v", err)
			}
		}
	})
}

// normalized returns a shallow copy of v with empty isa_ext and gpus lists set to nil: both
// are omitempty, so [] and an absent list encode (and are signed) identically.
func normalized(v *Vector) *Vector {
	n := *v
	if len(n.CPU.ISAExt) == 0 {
		n.CPU.ISAExt = nil
	}
	if len(n.GPUs) == 0 {
		n.GPUs = nil
	}
	return &n
}

// fuzzBases are correctly signed encodings, identical on every run (seeded key, fixed
// clock), for FuzzVerifySignature to damage.
func fuzzBases(tb testing.TB) []*Vector {
	key := seededKey(tb, 7)
	return []*Vector{
		signedVector(tb, key, nil),
		signedVector(tb, key, func(v *Vector) {
			v.CPU = CPU{Cores: 1, Arch: "arm64"}
			v.GPU, v.GPUs, v.Models = nil, nil, []Model{}
			v.NPU = NPU{}
			v.Battery = Battery{}
			v.Net = Net{Type: NetUnknown, Metered: true}
			v.Load = Load{}
			v.Seq = 18446744073709551615
		}),
		signedVector(tb, key, func(v *Vector) {
			v.Models = append(v.Models, Model{Name: "a<b>&c\u2028é\\\"/", State: ModelCold})
			v.CPU.Model = "Apple M3 Max — 16 cœurs"
			v.Net.RTTMS = 0.000123
		}),
		signedVector(tb, key, func(v *Vector) { *v = *mobileVector(testNow()) }),
	}
}

// FuzzVerifySignature damages a correctly signed vector at up to two fuzzer-chosen offsets
// (XOR with a fuzzer-chosen value). Verify must refuse the result, or accept it only as the
// vector that was signed: the same canonical bytes (e.g. a key whose letter case changed).
func FuzzVerifySignature(f *testing.F) {
	bases := fuzzBases(f)
	encs := make([][]byte, len(bases))
	for i, v := range bases {
		encs[i] = marshal(f, v)
	}
	for i, enc := range encs {
		// at is the offset of s plus delta, or of the opening brace when a base lacks s.
		at := func(s string, delta int) uint16 {
			j := bytes.Index(enc, []byte(s))
			if j < 0 {
				return 0
			}
			return uint16(j + delta)
		}
		b := uint8(i)
		last := uint16(len(enc) - 1)
		f.Add(b, uint16(0), byte(0), uint16(0), byte(0))                    // untouched
		f.Add(b, at(`"peer_id"`, 1), byte(0x20), uint16(0), byte(0))        // Peer_id: same vector
		f.Add(b, at(`"seq"`, 1), byte(0x20), at(`"sig"`, 2), byte(0x20))    // two keys upper-cased
		f.Add(b, at(`"sig":"`, 20), byte(0x01), uint16(0), byte(0))         // sig bit
		f.Add(b, at(`"sig":"`, 7), byte(0x01), uint16(0), byte(0))          // sig prefix
		f.Add(b, last-3, byte(0x01), uint16(0), byte(0))                    // sig padding bits
		f.Add(b, at(`"peer_id":"`, 20), byte(0x02), uint16(0), byte(0))     // peer ID
		f.Add(b, at(`"seq":`, 6), byte(0x01), uint16(0), byte(0))           // seq digit
		f.Add(b, at(`"expires_at":`, 20), byte(0x01), uint16(0), byte(0))   // expiry digit
		f.Add(b, at(`"issued_at":`, 12), byte(0x01), uint16(0), byte(0))    // issued digit
		f.Add(b, at(`"state":"`, 9), byte(0x20), uint16(0), byte(0))        // state letter
		f.Add(b, last, byte('}'^' '), uint16(0), byte(0))                   // closing brace
		f.Add(b, uint16(0), byte('{'^' '), last, byte('}'^' '))             // both braces
		f.Add(b, at(`"runtime":"`, 11), byte(0x80), uint16(0), byte(0))     // invalid UTF-8
		f.Add(b, at(`,"runtime"`, 0), byte(','^' '), uint16(0), byte(0))    // comma to space
		f.Add(b, at(`"accepting":`, 13), byte('t'^'f'), uint16(0), byte(0)) // true to fue
		f.Add(b, at(`"level":0.`, 9), byte('4'^'5'), uint16(0), byte(0))    // battery level digit
		f.Add(b, at(`"gpu":{`, 6), byte('{'^'['), uint16(0), byte(0))       // gpu object to list
	}
	now := testNow()
	f.Fuzz(func(t *testing.T, which uint8, off1 uint16, x1 byte, off2 uint16, x2 byte) {
		orig := bases[int(which)%len(bases)]
		data := bytes.Clone(encs[int(which)%len(encs)])
		data[int(off1)%len(data)] ^= x1
		data[int(off2)%len(data)] ^= x2
		got, err := Verify(data, now)
		if err != nil {
			if sentinelOf(err) == nil {
				t.Fatalf("Verify = %v, not one of the documented sentinels", err)
			}
			if bytes.Equal(data, encs[int(which)%len(encs)]) {
				t.Fatalf("Verify of the untouched encoding = %v", err)
			}
			return
		}
		if c, want := canonical(t, got), canonical(t, orig); !bytes.Equal(c, want) {
			t.Fatalf("Verify accepted a changed vector:\nwire %q\ngot  %s\nwant %s", data, c, want)
		}
		if got.PeerID != orig.PeerID {
			t.Fatalf("accepted peer_id %q, signed %q", got.PeerID, orig.PeerID)
		}
	})
}

// TestFuzzBasesVerify guards the fuzz setup: every base must verify untouched.
func TestFuzzBasesVerify(t *testing.T) {
	for i, v := range fuzzBases(t) {
		if _, err := Verify(marshal(t, v), testNow()); err != nil {
			t.Errorf("base %d: %v", i, err)
		}
		if len(marshal(t, v)) > MaxEncodedSize {
			t.Errorf("base %d too large to fuzz", i)
		}
	}
}
