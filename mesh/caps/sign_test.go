package caps

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
)

// forgery is an input Verify must refuse with the sentinel want (docs/reliability.md F7, F8, F9).
type forgery struct {
	name string
	data []byte
	want error
}

// forgeryKeys are the identities the forgery matrix is built from.
type forgeryKeys struct {
	a, b crypto.PrivKey // ed25519; a is the honest signer
	secp crypto.PrivKey
	rsa  crypto.PrivKey // nil leaves out the RSA cases (key generation is slow)
	// full adds the cases too costly for every fuzz worker's start: RSA and 10^6 models.
	full bool
}

func newForgeryKeys(tb testing.TB, full bool) forgeryKeys {
	tb.Helper()
	k := forgeryKeys{a: newKey(tb), b: newKey(tb), full: full}
	var err error
	if k.secp, _, err = crypto.GenerateSecp256k1Key(rand.Reader); err != nil {
		tb.Fatalf("generate secp256k1 key: %v", err)
	}
	if full {
		if k.rsa, _, err = crypto.GenerateRSAKeyPair(2048, rand.Reader); err != nil {
			tb.Fatalf("generate RSA key: %v", err)
		}
	}
	return k
}

// fieldChanges are edits made to a vector after it was signed; each is within bounds, so only
// the signature can catch it.
var fieldChanges = []struct {
	name string
	mut  func(*Vector)
}{
	{"models: one added", func(v *Vector) { v.Models = append(v.Models, Model{Name: "mixtral-8x7b", State: ModelWarm}) }},
	{"models: one renamed", func(v *Vector) { v.Models[0].Name = "llama-3.1-70b-instruct" }},
	{"models: cold claimed warm", func(v *Vector) { v.Models[1].State = ModelWarm }},
	{"models: all removed", func(v *Vector) { v.Models = nil }},
	{"load: in_flight", func(v *Vector) { v.Load.InFlight = 0 }},
	{"load: queue", func(v *Vector) { v.Load.Queue = 7 }},
	{"load: accepting", func(v *Vector) { v.Load.Accepting = false }},
	{"battery: level", func(v *Vector) { v.Battery.Level = 1 }},
	{"battery: charging", func(v *Vector) { v.Battery.Charging = false }},
	{"battery: floor", func(v *Vector) { v.Battery.Floor = 0.05 }},
	{"seq", func(v *Vector) { v.Seq = 2 }},
	{"expires_at extended", func(v *Vector) { v.Expires += 60_000 }},
	{"issued_at", func(v *Vector) { v.IssuedAt-- }},
	{"thermal", func(v *Vector) { v.Thermal = ThermalSerious }},
	{"gpu: vram", func(v *Vector) { editGPU(v, func(g *GPU) { g.VRAMMB = 81_920 }) }},
	{"gpu: vendor", func(v *Vector) { editGPU(v, func(g *GPU) { g.Vendor = "amd" }) }},
	{"gpu: stale", func(v *Vector) { editGPU(v, func(g *GPU) { g.Stale = true }) }},
	{"gpu: webgpu", func(v *Vector) { editGPU(v, func(g *GPU) { g.WebGPU = true }) }},
	{"gpu: another of gpus", func(v *Vector) { g := v.GPUs[0]; v.GPU = &g }},
	{"gpus: second copy added", func(v *Vector) { v.GPUs = append(v.GPUs, *v.GPU) }},
	{"gpus: list dropped", func(v *Vector) { v.GPUs = nil }},
	{"cpu: cores", func(v *Vector) { v.CPU.Cores = 128 }},
	{"cpu: isa_ext", func(v *Vector) { v.CPU.ISAExt = append(v.CPU.ISAExt, "amx") }},
	{"npu: present", func(v *Vector) { v.NPU = NPU{} }},
	{"npu: vendor", func(v *Vector) { v.NPU.Vendor = "intel" }},
	{"ram: free", func(v *Vector) { v.RAM.FreeMB = v.RAM.TotalMB }},
	{"net: type", func(v *Vector) { v.Net.Type = NetEthernet }},
	{"net: rtt", func(v *Vector) { v.Net.RTTMS = 1 }},
	{"net: metered", func(v *Vector) { v.Net.Metered = true }},
	{"runtime", func(v *Vector) { v.Runtime = RuntimeBrowser }},
	{"runtime and app_state", func(v *Vector) { v.Runtime, v.AppState = RuntimeAndroid, AppStateBackground }},
}

// forgeries builds the forgery matrix. Every case but the named ones starts from a vector
// that k.a signed correctly.
func forgeries(tb testing.TB, k forgeryKeys) []forgery {
	tb.Helper()
	now := testNow()
	var fs []forgery
	add := func(name string, data []byte, want error) {
		fs = append(fs, forgery{name: name, data: data, want: want})
	}
	signed := func(mut func(*Vector)) *Vector { return signedVector(tb, k.a, mut) }
	idA, idB := peerIDOf(tb, k.a), peerIDOf(tb, k.b)
	valid := marshal(tb, signed(nil))

	// Signer is not the claimed peer.
	v := signed(nil)
	v.PeerID = idB
	add("identity: A's sig, peer_id B", marshal(tb, v), ErrBadSignature)
	v = validVector(now)
	v.PeerID = idA
	v.Sig = sigOver(tb, k.b, canonical(tb, v))
	add("identity: B's sig over a vector claiming A", marshal(tb, v), ErrBadSignature)

	// A valid signature made under another domain tag.
	for _, d := range []string{
		"meshinfer/capability-vector/v1\n", // the caps/1 domain
		"meshinfer/capability-vector/v3\n",
		"meshinfer/capability-vector/v2", // no trailing newline
		"meshinfer/receipt/v1\n",
		"libp2p-peer-record",
		"", // no domain at all: the bare JSON
	} {
		v := signed(nil)
		body := canonical(tb, v)[len(Domain):]
		v.Sig = sigOver(tb, k.a, append([]byte(d), body...))
		add("domain: signed under "+strconv.Quote(d), marshal(tb, v), ErrBadSignature)
	}

	// A signature over other bytes of the same vector. Each render is what a careless signer
	// would produce; the sig covers render(v without sig) and the wire is render(v with sig).
	for _, r := range []struct {
		name   string
		mut    func(*Vector)
		render func(*Vector) []byte
	}{
		{"keys sorted", nil, func(v *Vector) []byte {
			var m map[string]any
			if err := json.Unmarshal(marshal(tb, v), &m); err != nil {
				tb.Fatalf("unmarshal: %v", err)
			}
			return marshal(tb, m)
		}},
		{"indented", nil, func(v *Vector) []byte {
			b, err := json.MarshalIndent(v, "", "  ")
			if err != nil {
				tb.Fatalf("indent: %v", err)
			}
			return b
		}},
		{"json.Encoder trailing newline", nil, func(v *Vector) []byte { return append(marshal(tb, v), '\n') }},
		{"empty sig field included", nil, func(v *Vector) []byte {
			if v.Sig != "" {
				return marshal(tb, v)
			}
			b := marshal(tb, v)
			return append(b[:len(b)-1], `,"sig":""}`...)
		}},
		{"html not escaped", func(v *Vector) { v.Models[0].Name = "llama<3>&co" }, func(v *Vector) []byte {
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(false)
			if err := enc.Encode(v); err != nil {
				tb.Fatalf("encode: %v", err)
			}
			return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
		}},
	} {
		v := signed(r.mut)
		v.Sig = ""
		v.Sig = sigOver(tb, k.a, append([]byte(Domain), r.render(v)...))
		add("non-canonical: "+r.name, r.render(v), ErrBadSignature)
	}

	// A field changed after signing.
	for _, c := range fieldChanges {
		v := signed(nil)
		c.mut(v)
		add("changed after signing: "+c.name, marshal(tb, v), ErrBadSignature)
	}

	// Wrong key types.
	v = validVector(now)
	v.PeerID = peerIDOf(tb, k.secp)
	v.Sig = sigOver(tb, k.secp, canonical(tb, v))
	add("key type: secp256k1 peer_id and sig", marshal(tb, v), ErrBadSignature)
	v = validVector(now)
	v.PeerID = idA
	v.Sig = sigOver(tb, k.secp, canonical(tb, v))
	add("key type: ed25519 peer_id, secp256k1 sig", marshal(tb, v), ErrBadSignature)
	if k.rsa != nil {
		v = validVector(now)
		v.PeerID = peerIDOf(tb, k.rsa)
		v.Sig = sigOver(tb, k.rsa, canonical(tb, v))
		add("key type: RSA peer_id and sig", marshal(tb, v), ErrBadSignature)
		v = validVector(now)
		v.PeerID = idA
		v.Sig = sigOver(tb, k.rsa, canonical(tb, v))
		add("key type: ed25519 peer_id, RSA sig", marshal(tb, v), ErrBadSignature)
	}
	v = signed(nil)
	v.PeerID = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N" // sha256 peer ID: no key inside
	add("key type: peer_id without an embedded key", marshal(tb, v), ErrBadSignature)
	v = signed(nil)
	v.PeerID = "not-a-peer-id"
	add("key type: peer_id unparsable", marshal(tb, v), ErrBadSignature)

	// The sig field itself.
	good := signed(nil)
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(good.Sig, sigPrefix))
	if err != nil || len(raw) != 64 {
		tb.Fatalf("Sign produced sig %q", good.Sig)
	}
	b64 := base64.StdEncoding.EncodeToString
	withSig := func(name, sig string) {
		v := signed(nil)
		v.Sig = sig
		add("sig: "+name, marshal(tb, v), ErrBadSignature)
	}
	withSig("truncated to 63 bytes", sigPrefix+b64(raw[:63]))
	withSig("base64 text cut in half", good.Sig[:len(good.Sig)/2])
	withSig("oversized 65 bytes", sigPrefix+b64(append(bytes.Clone(raw), 0)))
	withSig("oversized 128 bytes", sigPrefix+b64(append(bytes.Clone(raw), raw...)))
	withSig("data after padding", good.Sig+"AAAA")
	withSig("non-base64", sigPrefix+strings.Repeat("!", 88))
	withSig("unpadded base64", sigPrefix+base64.RawStdEncoding.EncodeToString(raw))
	withSig("non-zero padding bits", sigPrefix+nonZeroPadding(tb, b64(raw)))
	withSig("missing ed25519: prefix", b64(raw))
	withSig("secp256k1: prefix", "secp256k1:"+b64(raw))
	withSig("upper-case prefix", "ED25519:"+b64(raw))
	withSig("space after prefix", sigPrefix+" "+b64(raw))
	withSig("prefix only", sigPrefix)
	withSig("empty (field omitted)", "")
	withSig("all zero", sigPrefix+b64(make([]byte, 64)))
	withSig("malleated s+L", sigPrefix+b64(malleate(raw)))
	flipped := bytes.Clone(raw)
	flipped[0] ^= 1
	withSig("R flipped", sigPrefix+b64(flipped))
	flipped = bytes.Clone(raw)
	flipped[40] ^= 0x80
	withSig("S flipped", sigPrefix+b64(flipped))
	noSig := marshal(tb, validVector(now))
	add("sig: explicitly empty", bytes.Replace(noSig, []byte(`"peer_id":""`), []byte(`"peer_id":"`+idA+`","sig":""`), 1), ErrBadSignature)
	add("sig: null", bytes.Replace(noSig, []byte(`"peer_id":""`), []byte(`"peer_id":"`+idA+`","sig":null`), 1), ErrBadSignature)

	// Impossible values, signed correctly so that only the bound is wrong. mut runs again
	// after Sign for the one case Sign overrides (peer_id); the others are idempotent.
	for _, c := range outOfBounds() {
		v := signed(c.mut)
		c.mut(v)
		add("bounds: "+c.name, marshal(tb, v), ErrOutOfBounds)
	}
	if k.full {
		million := make([]byte, 0, 32<<20)
		million = append(million, `"models":[`...)
		for i := range 1_000_000 {
			if i > 0 {
				million = append(million, ',')
			}
			million = append(million, `{"name":"m`...)
			million = strconv.AppendInt(million, int64(i), 10)
			million = append(million, `","state":"warm"}`...)
		}
		million = append(million, ']')
		add("bounds: 10^6 models", bytes.Replace(marshal(tb, signed(func(v *Vector) { v.Models = nil })),
			[]byte(`"models":null`), million, 1), ErrTooLarge)
	}
	add("size: in bounds but over MaxEncodedSize", marshal(tb, signed(func(v *Vector) {
		v.CPU.ISAExt = make([]string, MaxISA)
		v.Models = make([]Model, MaxModels)
		for i := range MaxModels {
			v.CPU.ISAExt[i] = fmt.Sprintf("%0128d", i)
			v.Models[i] = Model{Name: fmt.Sprintf("%0128d", i), State: ModelWarm,
				Layers: MaxLayers, WeightBytes: MaxModelBytes, KVBytesPerToken: MaxModelBytes}
		}
		v.GPUs = make([]GPU, MaxGPUs)
		for i := range MaxGPUs {
			v.GPUs[i] = GPU{Vendor: fmt.Sprintf("%0128d", i), Model: fmt.Sprintf("%0128d", i), VRAMMB: MaxVRAMMB}
		}
		v.GPU = &v.GPUs[0]
	})), ErrTooLarge)
	add("size: MaxEncodedSize+1 bytes", pad(valid, MaxEncodedSize+1), ErrTooLarge)

	// Strict decoding.
	add("decode: unknown field", bytes.Replace(valid, []byte(`{`), []byte(`{"extra":1,`), 1), ErrMalformed)
	add("decode: unknown nested field", bytes.Replace(valid, []byte(`"cpu":{`), []byte(`"cpu":{"turbo":true,`), 1), ErrMalformed)
	v = signed(nil)
	v.Sig = ""
	withExtra := bytes.Replace(marshal(tb, v), []byte(`{`), []byte(`{"region":"eu",`), 1)
	v.Sig = sigOver(tb, k.a, append([]byte(Domain), withExtra...))
	add("decode: unknown field covered by the sig", bytes.Replace(marshal(tb, v), []byte(`{`), []byte(`{"region":"eu",`), 1), ErrMalformed)
	for _, tail := range []string{"x", "{}", "null", "]", "}", "\n{", "0", string(valid)} {
		add("decode: trailing "+strconv.Quote(trim(tail)), append(bytes.Clone(valid), tail...), ErrMalformed)
	}
	for name, s := range map[string]string{
		"empty":                   "",
		"whitespace only":         " \n\t",
		"array":                   "[]",
		"string":                  `"caps"`,
		"number":                  "1",
		"true":                    "true",
		"NUL byte":                "\x00",
		"invalid UTF-8":           "\xff\xfe{}",
		"truncated":               string(valid[:len(valid)-1]),
		"seq as string":           strings.Replace(string(valid), `"seq":1`, `"seq":"1"`, 1),
		"seq negative":            strings.Replace(string(valid), `"seq":1`, `"seq":-1`, 1),
		"seq fractional":          strings.Replace(string(valid), `"seq":1`, `"seq":1.5`, 1),
		"seq 2^64":                strings.Replace(string(valid), `"seq":1`, `"seq":18446744073709551616`, 1),
		"cores in exponent form":  strings.Replace(string(valid), `"cores":16`, `"cores":1.6e1`, 1),
		"rtt 1e400":               strings.Replace(string(valid), `"rtt_ms":23.5`, `"rtt_ms":1e400`, 1),
		"rtt NaN literal":         strings.Replace(string(valid), `"rtt_ms":23.5`, `"rtt_ms":NaN`, 1),
		"gpu as list":             strings.Replace(string(valid), `"gpu":{`, `"gpu":[{`, 1),
		"gpus as object":          strings.Replace(string(valid), `"gpus":[`, `"gpus":{"0":`, 1),
		"battery level as string": strings.Replace(string(valid), `"level":0.87`, `"level":"0.87"`, 1),
		"10000 [":                 strings.Repeat("[", 10_000),
		"8000 nested arrays":      strings.Repeat("[", 8000) + strings.Repeat("]", 8000),
		"nested objects":          strings.Repeat(`{"a":`, 2000) + "1" + strings.Repeat("}", 2000),
		"nested arrays in gpu":    `{"gpu":` + strings.Repeat("[", 10_000),
		"nested arrays in models": `{"peer_id":"x","models":[` + strings.Repeat("[", 8000) + strings.Repeat("]", 8000) + `]}`,
	} {
		add("decode: "+name, []byte(s), ErrMalformed)
	}
	// Well-formed JSON that decodes to the zero vector is refused by the bounds.
	add("decode: null", []byte("null"), ErrOutOfBounds)
	add("decode: {}", []byte("{}"), ErrOutOfBounds)

	// Time window (docs/reliability.md F5, F8).
	at := func(issued time.Time, ttl time.Duration) []byte {
		return marshal(tb, signed(func(v *Vector) {
			v.IssuedAt = issued.UnixMilli()
			v.Expires = issued.Add(ttl).UnixMilli()
		}))
	}
	// Expiry allows MaxClockSkew for a signer whose clock is behind ours.
	add("time: expired exactly MaxClockSkew ago", at(now.Add(-testTTL-MaxClockSkew), testTTL), ErrExpired)
	add("time: expired MaxClockSkew + 1 ms ago", at(now.Add(-testTTL-MaxClockSkew-time.Millisecond), testTTL), ErrExpired)
	add("time: replayed after an hour", at(now.Add(-time.Hour), testTTL), ErrExpired)
	add("time: issued MaxTTL + MaxClockSkew ago with MaxTTL", at(now.Add(-MaxTTL-MaxClockSkew), MaxTTL), ErrExpired)
	add("time: issued 5 min + 1 ms ahead", at(now.Add(MaxClockSkew+time.Millisecond), testTTL), ErrClockSkew)
	add("time: issued 1 h ahead", at(now.Add(time.Hour), testTTL), ErrClockSkew)
	return fs
}

// pad appends spaces (insignificant trailing whitespace) to b up to n bytes.
func pad(b []byte, n int) []byte {
	return append(bytes.Clone(b), bytes.Repeat([]byte(" "), n-len(b))...)
}

func trim(s string) string {
	if len(s) > 8 {
		return s[:8] + "…"
	}
	return s
}

// nonZeroPadding sets the unused low bits of the last base64 character of a 64-byte value,
// which a lenient decoder ignores and a strict one refuses.
func nonZeroPadding(tb testing.TB, s string) string {
	tb.Helper()
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	if len(s) != 88 || !strings.HasSuffix(s, "==") {
		tb.Fatalf("unexpected base64 %q", s)
	}
	i := strings.IndexByte(alphabet, s[85])
	return s[:85] + string(alphabet[i|1]) + "=="
}

// malleate returns the signature (R, S+L): the same point equation holds, so a verifier that
// does not insist on S < L (RFC 8032 §5.1.7) would accept it.
func malleate(sig []byte) []byte {
	l := [32]byte{0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde, 0x14,
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10}
	out := bytes.Clone(sig)
	carry := 0
	for i := range 32 {
		s := int(out[32+i]) + int(l[i]) + carry
		out[32+i], carry = byte(s), s>>8
	}
	return out
}

// decodeLayer are the sentinels Decode itself returns; the others come from Verify.
var decodeLayer = []error{ErrTooLarge, ErrMalformed, ErrOutOfBounds}

func TestVerifyForgeryMatrix(t *testing.T) {
	now := testNow()
	for _, f := range forgeries(t, newForgeryKeys(t, true)) {
		t.Run(f.name, func(t *testing.T) {
			got, err := Verify(f.data, now)
			if !errors.Is(err, f.want) {
				t.Fatalf("Verify = %v, want %v", err, f.want)
			}
			if got != nil {
				t.Fatalf("Verify returned a vector with error %v", err)
			}
			// The layer that refuses is the right one: what Decode accepts is well formed
			// and in bounds, so only the signature or the time window can be wrong.
			_, derr := Decode(f.data)
			if slices.Contains(decodeLayer, f.want) {
				if !errors.Is(derr, f.want) {
					t.Fatalf("Decode = %v, want %v", derr, f.want)
				}
			} else if derr != nil {
				t.Fatalf("Decode = %v, want nil (the forgery must be caught by Verify alone)", derr)
			}
		})
	}
	t.Logf("figure F7: every forgery of the matrix refused by Verify with its sentinel")
}

func TestVerifyTimeWindow(t *testing.T) {
	now := testNow()
	key := newKey(t)
	cases := []struct {
		name   string
		issued time.Duration // relative to the receiver's now
		ttl    time.Duration
		want   error
	}{
		{"fresh", 0, testTTL, nil},
		{"expires in 1 ms", -testTTL + time.Millisecond, testTTL, nil},
		{"expired now, within the skew allowance", -testTTL, testTTL, nil},
		{"expired 5 min - 1 ms ago, within the skew allowance", -testTTL - MaxClockSkew + time.Millisecond, testTTL, nil},
		{"expired exactly 5 min ago", -testTTL - MaxClockSkew, testTTL, ErrExpired},
		{"expired 5 min + 1 ms ago", -testTTL - MaxClockSkew - time.Millisecond, testTTL, ErrExpired},
		{"issued 1 ms ahead", time.Millisecond, testTTL, nil},
		{"issued exactly 5 min ahead", MaxClockSkew, testTTL, nil},
		{"issued 5 min + 1 ms ahead", MaxClockSkew + time.Millisecond, testTTL, ErrClockSkew},
		{"issued 5 min ahead with MaxTTL", MaxClockSkew, MaxTTL, nil},
		// The oldest acceptable issue time is MaxTTL + MaxClockSkew - 1 ms ago.
		{"issued 15 min - 1 ms ago with MaxTTL", -MaxTTL - MaxClockSkew + time.Millisecond, MaxTTL, nil},
		{"issued 15 min ago with MaxTTL", -MaxTTL - MaxClockSkew, MaxTTL, ErrExpired},
		{"issued 10 min ago, expiring in 1 ms", -MaxTTL, MaxTTL + time.Millisecond, ErrOutOfBounds},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := signedVector(t, key, func(v *Vector) {
				v.IssuedAt = now.Add(tc.issued).UnixMilli()
				v.Expires = now.Add(tc.issued + tc.ttl).UnixMilli()
			})
			got, err := Verify(marshal(t, v), now)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Verify = %v, want acceptance", err)
				}
				if !reflect.DeepEqual(got, v) {
					t.Fatalf("Verify returned %+v, want %+v", got, v)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
	t.Logf("figure F5: issued_at and expires_at outside their windows refused; inside accepted")
}

// TestVerifyClockSkewF5 runs the docs/reliability.md F5 matrix: the signer's wall clock is off by
// skew, it issues a vector valid for one realistic TTL, and the receiver checks it at once.
// F5: |skew| <= 5 min is accepted; beyond, it is refused (Ignore, not Reject). A signer
// ahead of us is refused as clock_skew; one behind us by more than the allowance cannot be
// told apart from a replay of an old record and is refused as expired.
func TestVerifyClockSkewF5(t *testing.T) {
	now := testNow()
	key := newKey(t)
	for _, skew := range []time.Duration{-10 * time.Minute, -4 * time.Minute, -time.Minute, 0, 4 * time.Minute, 5 * time.Minute, 10 * time.Minute} {
		t.Run(skew.String(), func(t *testing.T) {
			signerNow := now.Add(skew)
			v := signedVector(t, key, func(v *Vector) {
				v.IssuedAt = signerNow.UnixMilli()
				v.Expires = signerNow.Add(testTTL).UnixMilli()
			})
			_, err := Verify(marshal(t, v), now)
			var want error
			switch {
			case skew > MaxClockSkew:
				want = ErrClockSkew
			case skew < -MaxClockSkew:
				want = ErrExpired
			}
			if want == nil && err != nil {
				t.Fatalf("Verify = %v, want acceptance", err)
			}
			if want != nil && !errors.Is(err, want) {
				t.Fatalf("Verify = %v, want %v", err, want)
			}
		})
	}
	t.Logf("figure F5: signers off by -10 to +10 min: |skew| ≤ 5 min accepted, beyond refused as clock skew")
}

// TestVerifyEquivalentWire: the signature covers the vector, not the bytes on the wire, so
// layouts that decode to the same vector are accepted.
func TestVerifyEquivalentWire(t *testing.T) {
	now := testNow()
	v := signedVector(t, newKey(t), nil)
	valid := marshal(t, v)
	var sorted map[string]any
	if err := json.Unmarshal(valid, &sorted); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	indented, err := json.MarshalIndent(v, "", "\t")
	if err != nil {
		t.Fatalf("indent: %v", err)
	}
	cases := []struct {
		name string
		data []byte
	}{
		{"as encoded", valid},
		{"leading whitespace", append([]byte(" \t\r\n"), valid...)},
		{"trailing newline", append(bytes.Clone(valid), '\n')},
		{"padded to exactly MaxEncodedSize", pad(valid, MaxEncodedSize)},
		{"keys sorted", marshal(t, sorted)},
		{"indented", indented},
		{"string with \\u escape", bytes.Replace(valid, []byte(`"desktop"`), []byte(`"\u0064esktop"`), 1)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Verify(tc.data, now)
			if err != nil {
				t.Fatalf("Verify = %v, want acceptance", err)
			}
			if !reflect.DeepEqual(got, v) {
				t.Fatalf("Verify returned %+v, want %+v", got, v)
			}
		})
	}
}

// TestVerifyWireMalleability covers layouts a strict decoder might refuse; whatever Verify
// does with them, it must never accept a vector other than the one that was signed (the sig
// field itself is not signed, so only the canonical bytes must match).
func TestVerifyWireMalleability(t *testing.T) {
	now := testNow()
	v := signedVector(t, newKey(t), nil)
	valid := marshal(t, v)
	sig := []byte(strconv.Quote(v.Sig))
	cases := []struct {
		name string
		data []byte
	}{
		{"upper-case key", bytes.Replace(valid, []byte(`"peer_id"`), []byte(`"PEER_ID"`), 1)},
		{"key with long s (U+017F)", bytes.Replace(valid, []byte(`"seq"`), []byte(`"ſeq"`), 1)},
		{"newline escape inside the base64 sig", bytes.Replace(valid, sig, []byte(`"`+v.Sig[:30]+`\n`+v.Sig[30:]+`"`), 1)},
		{"duplicate sig, garbage first", bytes.Replace(valid, []byte(`"sig":`), []byte(`"sig":"ed25519:AAAA","sig":`), 1)},
		{"duplicate seq, signed value last", bytes.Replace(valid, []byte(`"seq":1`), []byte(`"seq":2,"seq":1`), 1)},
		{"duplicate seq, forged value last", bytes.Replace(valid, []byte(`"seq":1`), []byte(`"seq":1,"seq":2`), 1)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Verify(tc.data, now)
			if err != nil {
				if sentinelOf(err) == nil {
					t.Fatalf("Verify = %v, not one of the documented sentinels", err)
				}
				t.Logf("refused: %v", err)
				return
			}
			if !bytes.Equal(canonical(t, got), canonical(t, v)) {
				t.Fatalf("Verify accepted a different vector:\n%s\nwant\n%s", canonical(t, got), canonical(t, v))
			}
			t.Logf("accepted as the signed vector (sig field %q)", got.Sig)
		})
	}
}

// TestVerifiedVectorCanBeEncoded: whatever Verify accepts must be sendable again with Encode
// (a receiver may relay or serve a verified vector). encoding/json escapes <, >, & and
// U+2028/9, so the canonical form can be several times longer than the wire form it came in.
func TestVerifiedVectorCanBeEncoded(t *testing.T) {
	for _, r := range []string{"<", "&", "\u2028"} {
		t.Run(strconv.QuoteToASCII(r), func(t *testing.T) {
			// wire is what a JavaScript signer's JSON.stringify would send.
			wire := func(v *Vector) []byte {
				var buf bytes.Buffer
				enc := json.NewEncoder(&buf)
				enc.SetEscapeHTML(false)
				if err := enc.Encode(v); err != nil {
					t.Fatalf("encode: %v", err)
				}
				// encoding/json escapes U+2028 even with SetEscapeHTML(false); JavaScript does not.
				return bytes.ReplaceAll(buf.Bytes(), []byte(`\u2028`), []byte("\u2028"))
			}
			name := func(i int) string { return fmt.Sprintf("%s%02d", strings.Repeat(r, (MaxString-2)/len(r)), i) }
			v := validVector(testNow())
			v.Models = make([]Model, MaxModels)
			for i := range v.Models {
				v.Models[i] = Model{Name: name(i), State: ModelWarm}
			}
			// Fill the ISA list as far as the wire form stays within MaxEncodedSize.
			v.CPU.ISAExt = nil
			for len(v.CPU.ISAExt) < MaxISA {
				v.CPU.ISAExt = append(v.CPU.ISAExt, name(len(v.CPU.ISAExt)))
				if len(wire(v))+200 > MaxEncodedSize { // room for peer_id and sig
					v.CPU.ISAExt = v.CPU.ISAExt[:len(v.CPU.ISAExt)-1]
					break
				}
			}
			if err := Sign(newKey(t), v); err != nil {
				t.Fatalf("Sign: %v", err)
			}
			data := wire(v)
			if len(data) > MaxEncodedSize {
				t.Fatalf("test setup: wire form is %d bytes", len(data))
			}
			got, err := Verify(data, testNow())
			if err != nil {
				t.Logf("refused (%d wire bytes): %v", len(data), err)
				return
			}
			if _, err := Encode(got); err != nil {
				t.Fatalf("Encode of a verified vector: %v", err)
			}
		})
	}
}
