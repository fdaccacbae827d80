package caps

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// nowMS is the receiver's clock in every test, in unix milliseconds (2027-01-15).
const nowMS = 1_800_000_000_000

// testTTL is the validity a realistic signer gives a vector: three 15 s heartbeats.
const testTTL = 45 * time.Second

func testNow() time.Time { return time.UnixMilli(nowMS) }

// newKey returns a fresh ed25519 identity key.
func newKey(tb testing.TB) crypto.PrivKey {
	tb.Helper()
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		tb.Fatalf("generate ed25519 key: %v", err)
	}
	return k
}

// seededKey returns an ed25519 key derived from seed, so that fuzz targets, benchmarks and
// known-answer tests see the same bytes on every run.
func seededKey(tb testing.TB, seed byte) crypto.PrivKey {
	tb.Helper()
	k, _, err := crypto.GenerateEd25519Key(bytes.NewReader(bytes.Repeat([]byte{seed}, 32)))
	if err != nil {
		tb.Fatalf("generate seeded ed25519 key: %v", err)
	}
	return k
}

// validVector returns an unsigned vector that passes Validate once it has a peer ID: a
// laptop-class desktop node with two GPUs, an NPU, two models, issued at now for testTTL.
func validVector(now time.Time) *Vector {
	dgpu := GPU{Vendor: "nvidia", Model: "NVIDIA GeForce RTX 4070 Laptop GPU", VRAMMB: 8188}
	return &Vector{
		Runtime: RuntimeDesktop,
		CPU: CPU{
			Cores:  16,
			Arch:   "amd64",
			Model:  "AMD Ryzen 9 7940HS w/ Radeon 780M Graphics",
			ISAExt: []string{"avx2", "avx512f", "fma"},
		},
		GPU:      &dgpu,
		GPUs:     []GPU{{Vendor: "amd", Model: "AMD Radeon 780M", VRAMMB: 512}, dgpu},
		NPU:      NPU{Present: true, Vendor: "amd"},
		RAM:      RAM{TotalMB: 31_416, FreeMB: 18_230},
		Battery:  Battery{Present: true, Level: 0.87, Charging: true, Floor: 0.3},
		Thermal:  ThermalNominal,
		AppState: AppStateForeground,
		Net:      Net{Type: NetWiFi, RTTMS: 23.5, DownlinkMbps: 94.2},
		Models: []Model{
			{Name: "llama-3.1-8b-instruct-q4_k_m", State: ModelWarm},
			{Name: "qwen2.5-7b-instruct-q4_k_m", State: ModelCold},
		},
		Load:     Load{InFlight: 1, Queue: 0, Accepting: true},
		Seq:      1,
		IssuedAt: now.UnixMilli(),
		Expires:  now.Add(testTTL).UnixMilli(),
	}
}

// mobileVector returns an unsigned vector of an Android phone doing a granted background
// task: battery at 42 % and charging, on a metered cellular network, no GPU list.
func mobileVector(now time.Time) *Vector {
	return &Vector{
		Runtime:  RuntimeAndroid,
		CPU:      CPU{Cores: 8, Arch: "arm64", Model: "Qualcomm Snapdragon 8 Gen 2", ISAExt: []string{"asimd", "asimddp", "i8mm"}},
		GPU:      &GPU{Vendor: "qualcomm", Model: "Adreno 740"},
		NPU:      NPU{Present: true, Vendor: "qualcomm"},
		RAM:      RAM{TotalMB: 11_811, FreeMB: 4_096},
		Battery:  Battery{Present: true, Level: 0.42, Charging: true, Floor: 0.3},
		Thermal:  ThermalFair,
		AppState: AppStateBackgroundTask,
		Net:      Net{Type: NetCellular, RTTMS: 68, DownlinkMbps: 12.5, Metered: true},
		Models:   []Model{{Name: "qwen2.5-0.5b-instruct-q4_k_m", State: ModelWarm}},
		Load:     Load{Capacity: 1, Accepting: true},
		Seq:      1,
		IssuedAt: now.UnixMilli(),
		Expires:  now.Add(testTTL).UnixMilli(),
	}
}

// editGPU applies f to the primary GPU and to its entry in gpus, so that the vector stays
// consistent (gpu is one of gpus) and only f's change differs.
func editGPU(v *Vector, f func(*GPU)) {
	for i := range v.GPUs {
		if v.GPUs[i] == *v.GPU {
			f(&v.GPUs[i])
		}
	}
	f(v.GPU)
}

// signedVector returns validVector(testNow()) changed by mut (when not nil) and then signed
// by key, so that whatever mut did is covered by a correct signature.
func signedVector(tb testing.TB, key crypto.PrivKey, mut func(*Vector)) *Vector {
	tb.Helper()
	v := validVector(testNow())
	if mut != nil {
		mut(v)
	}
	if err := Sign(key, v); err != nil {
		tb.Fatalf("Sign: %v", err)
	}
	return v
}

// marshal is json.Marshal without Encode's size limit, so tests can build oversized input.
func marshal(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatalf("marshal: %v", err)
	}
	return b
}

// sigOver signs msg with key directly, bypassing Sign, and formats it as the sig field.
func sigOver(tb testing.TB, key crypto.PrivKey, msg []byte) string {
	tb.Helper()
	sig, err := key.Sign(msg)
	if err != nil {
		tb.Fatalf("sign: %v", err)
	}
	return sigPrefix + base64.StdEncoding.EncodeToString(sig)
}

// peerIDOf returns the string peer ID of key.
func peerIDOf(tb testing.TB, key crypto.PrivKey) string {
	tb.Helper()
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		tb.Fatalf("peer ID: %v", err)
	}
	return id.String()
}

// canonical is Canonical that fails the test on error.
func canonical(tb testing.TB, v *Vector) []byte {
	tb.Helper()
	b, err := Canonical(v)
	if err != nil {
		tb.Fatalf("Canonical: %v", err)
	}
	return b
}

// sentinels are the errors callers of Decode and Verify act on; every failure must be one.
var sentinels = []error{ErrTooLarge, ErrMalformed, ErrOutOfBounds, ErrBadSignature, ErrExpired, ErrClockSkew}

// sentinelOf returns the sentinel err wraps, or nil.
func sentinelOf(err error) error {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return s
		}
	}
	return nil
}

func TestValidVectorHelper(t *testing.T) {
	v := signedVector(t, newKey(t), nil)
	if err := v.Validate(); err != nil {
		t.Fatalf("validVector does not validate: %v", err)
	}
	b, err := Encode(v)
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	if len(b) > MaxEncodedSize/4 {
		t.Errorf("a typical vector encodes to %d bytes, want well under MaxEncodedSize", len(b))
	}
}

func TestRoundTrip(t *testing.T) {
	key := newKey(t)
	v := signedVector(t, key, nil)
	if want := peerIDOf(t, key); v.PeerID != want {
		t.Fatalf("Sign set peer_id %q, want %q", v.PeerID, want)
	}
	if !strings.HasPrefix(v.Sig, sigPrefix) {
		t.Fatalf("Sign set sig %q, want prefix %q", v.Sig, sigPrefix)
	}
	b, err := Encode(v)
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	got, err := Verify(b, testNow())
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if !reflect.DeepEqual(got, v) {
		t.Fatalf("Verify returned\n%+v\nwant\n%+v", got, v)
	}
	dec, err := Decode(b)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if !reflect.DeepEqual(dec, v) {
		t.Fatalf("Decode returned\n%+v\nwant\n%+v", dec, v)
	}
}

// TestStagesRoundTrip: a node holding layer ranges for pipelines announces them under
// "stages"; a node holding none sends no "stages" at all, so its vector encodes as before
// the field existed. A synthetic node listing MaxStages ranges stays far under
// MaxEncodedSize.
func TestStagesRoundTrip(t *testing.T) {
	key := newKey(t)
	none := marshal(t, signedVector(t, key, nil))
	if bytes.Contains(none, []byte(`"stages"`)) {
		t.Fatalf("a vector without stages mentions them: %s", none)
	}
	v := signedVector(t, key, func(v *Vector) {
		v.Models = []Model{{Name: "synth-large", State: ModelCold, Deterministic: true, Layers: 16, WeightBytes: 481 << 20, KVBytesPerToken: 96 << 10}}
		v.Stages = []Stage{{Model: "synth-large", Lo: 0, Hi: 8, State: StageLoading}, {Model: "synth-large", Lo: 8, Hi: 16, State: StageWarm}}
	})
	b, err := Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	want := `"stages":[{"model":"synth-large","lo":0,"hi":8,"state":"loading"},{"model":"synth-large","lo":8,"hi":16,"state":"warm"}]`
	if !bytes.Contains(b, []byte(want)) {
		t.Fatalf("wire form %s lacks %s", b, want)
	}
	got, err := Verify(b, testNow())
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if !reflect.DeepEqual(got, v) {
		t.Fatalf("Verify returned\n%+v\nwant\n%+v", got, v)
	}

	full := signedVector(t, key, func(v *Vector) {
		v.Models = nil
		for _, name := range []string{"synth-tiny", "synth-small", "synth-base", "synth-large"} {
			v.Models = append(v.Models, Model{Name: name, State: ModelCold, Deterministic: true, Layers: 16, WeightBytes: 481 << 20, KVBytesPerToken: 96 << 10})
		}
		v.Stages = make([]Stage, MaxStages)
		for i := range v.Stages {
			v.Stages[i] = Stage{Model: "synth-large", Lo: i % 16, Hi: 16, State: StageLoading}
			if i >= 16 {
				v.Stages[i].Model = v.Models[i/16-1].Name
			}
		}
	})
	if b, err := Encode(full); err != nil || len(b) > MaxEncodedSize/4 {
		t.Fatalf("a synthetic node with %d stages encodes to %d bytes (%v), want under %d", MaxStages, len(b), err, MaxEncodedSize/4)
	}
}

func TestSignIsDeterministicAndReplacesOldSig(t *testing.T) {
	key := newKey(t)
	v := signedVector(t, key, nil)
	first := v.Sig
	if err := Sign(key, v); err != nil {
		t.Fatalf("second Sign: %v", err)
	}
	if v.Sig != first {
		t.Fatalf("re-signing an unchanged vector gave %q, want %q (ed25519 is deterministic and sig is not signed)", v.Sig, first)
	}
	v.Seq++
	if err := Sign(key, v); err != nil {
		t.Fatalf("Sign after change: %v", err)
	}
	if v.Sig == first {
		t.Fatalf("sig unchanged after seq changed")
	}
	if _, err := Verify(marshal(t, v), testNow()); err != nil {
		t.Fatalf("Verify after re-signing: %v", err)
	}
}

func TestSignRefusesOtherKeyTypes(t *testing.T) {
	secp, _, err := crypto.GenerateSecp256k1Key(rand.Reader)
	if err != nil {
		t.Fatalf("generate secp256k1 key: %v", err)
	}
	v := validVector(testNow())
	if err := Sign(secp, v); err == nil {
		t.Fatalf("Sign with a secp256k1 key succeeded, want an error")
	}
	if v.Sig != "" || v.PeerID != "" {
		t.Fatalf("failed Sign changed the vector: peer_id %q sig %q", v.PeerID, v.Sig)
	}
}

func TestSignRefusesUnencodableVector(t *testing.T) {
	v := validVector(testNow())
	v.Net.RTTMS = math.NaN()
	if err := Sign(newKey(t), v); err == nil {
		t.Fatalf("Sign of a vector with NaN rtt succeeded, want an error")
	}
}

// TestCanonicalKnownAnswer pins the signed encoding of caps/2: field names (the design's
// contract), field order, omitempty, HTML escaping, the domain tag and the signature format. A
// change here breaks every deployed verifier (and any non-Go signer); it must come with a new
// Domain and topic version.
func TestCanonicalKnownAnswer(t *testing.T) {
	key := seededKey(t, 1)
	v := validVector(testNow())
	v.Models = append(v.Models, Model{Name: "a<b>&c", State: ModelCold}) // escaped by encoding/json
	if err := Sign(key, v); err != nil {
		t.Fatalf("Sign: %v", err)
	}
	const wantPeer = "12D3KooWK99VoVxNE7XzyBwXEzW7xhK7Gpv85r9F3V3fyKSUKPH5"
	const wantBody = `{"peer_id":"` + wantPeer + `","runtime":"desktop",` +
		`"cpu":{"cores":16,"arch":"amd64","model":"AMD Ryzen 9 7940HS w/ Radeon 780M Graphics","isa_ext":["avx2","avx512f","fma"]},` +
		`"gpu":{"vendor":"nvidia","model":"NVIDIA GeForce RTX 4070 Laptop GPU","vram_mb":8188,"webgpu":false},` +
		`"gpus":[{"vendor":"amd","model":"AMD Radeon 780M","vram_mb":512,"webgpu":false},` +
		`{"vendor":"nvidia","model":"NVIDIA GeForce RTX 4070 Laptop GPU","vram_mb":8188,"webgpu":false}],` +
		`"npu":{"present":true,"vendor":"amd"},"ram":{"total_mb":31416,"free_mb":18230},` +
		`"battery":{"present":true,"level":0.87,"charging":true,"floor":0.3},"thermal":"nominal","app_state":"foreground",` +
		`"net":{"type":"wifi","rtt_ms":23.5,"downlink_mbps":94.2,"metered":false},` +
		`"models":[{"name":"llama-3.1-8b-instruct-q4_k_m","state":"warm"},{"name":"qwen2.5-7b-instruct-q4_k_m","state":"cold"},` +
		`{"name":"a\u003cb\u003e\u0026c","state":"cold"}],` +
		`"load":{"in_flight":1,"queue":0,"accepting":true},"seq":1,"issued_at":1800000000000,"expires_at":1800000045000}`
	const wantSig = "ed25519:EI7SD6yUcBvZPMiiseaoasf8lFYoVccmJ4B9HF52yEiOZQFb2VP9nU2/KHyDUXUhn3Dq5Sk4ihWARG4/LTkRBA=="
	if v.PeerID != wantPeer {
		t.Fatalf("peer_id %q, want %q", v.PeerID, wantPeer)
	}
	if got := string(canonical(t, v)); got != Domain+wantBody {
		t.Fatalf("Canonical =\n%q\nwant\n%q", got, Domain+wantBody)
	}
	if v.Sig != wantSig {
		t.Fatalf("sig %q, want %q", v.Sig, wantSig)
	}
	// Independently of libp2p and encoding/json: the hand-written bytes verify with the
	// standard library's ed25519 under the seed's public key.
	pub := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, ed25519.SeedSize)).Public().(ed25519.PublicKey)
	rawSig, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(wantSig, sigPrefix))
	if err != nil || !ed25519.Verify(pub, []byte(Domain+wantBody), rawSig) {
		t.Fatalf("wantSig does not verify over Domain+wantBody with crypto/ed25519 (err %v)", err)
	}
	enc, err := Encode(v)
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	if want := strings.TrimSuffix(wantBody, "}") + `,"sig":"` + wantSig + `"}`; string(enc) != want {
		t.Fatalf("Encode =\n%s\nwant\n%s", enc, want)
	}
}

func TestCanonicalIgnoresSig(t *testing.T) {
	v := signedVector(t, newKey(t), nil)
	signedBytes := canonical(t, v)
	v.Sig = ""
	if !bytes.Equal(canonical(t, v), signedBytes) {
		t.Fatalf("Canonical depends on sig")
	}
	if !bytes.HasPrefix(signedBytes, []byte(Domain)) {
		t.Fatalf("Canonical lacks the domain prefix: %q", signedBytes[:40])
	}
	if bytes.Contains(signedBytes, []byte(`"sig"`)) {
		t.Fatalf("Canonical contains the sig field")
	}
}

func TestCloneDeepCopy(t *testing.T) {
	v := signedVector(t, newKey(t), func(v *Vector) {
		v.Stages = []Stage{{Model: v.Models[0].Name, Lo: 0, Hi: 4, State: StageLoading}}
	})
	want := marshal(t, v)
	c := v.Clone()
	if !reflect.DeepEqual(c, v) {
		t.Fatalf("Clone =\n%+v\nwant\n%+v", c, v)
	}
	c.CPU.ISAExt[0] = "sse2"
	c.CPU.ISAExt = append(c.CPU.ISAExt, "amx")
	c.GPU.VRAMMB = 1
	c.GPU.Model = "changed"
	c.GPUs[0].VRAMMB = 1
	c.GPUs = append(c.GPUs, GPU{Vendor: "amd"})
	c.Models[0].Name = "changed"
	c.Models[1].State = ModelWarm
	c.Models = append(c.Models, Model{Name: "extra", State: ModelWarm})
	c.Stages[0].State = StageWarm
	c.Stages = append(c.Stages, Stage{Model: "extra", Lo: 1, Hi: 2, State: StageWarm})
	c.Seq = 99
	if got := marshal(t, v); !bytes.Equal(got, want) {
		t.Fatalf("mutating the clone changed the original:\n%s\nwant\n%s", got, want)
	}
	// And the other way round: the clone must not see later changes of the original.
	c = v.Clone()
	v.CPU.ISAExt[0] = "neon"
	v.GPU.Vendor = "apple"
	v.GPUs[0].Vendor = "apple"
	v.Models[0].State = ModelCold
	v.Stages[0].Hi = 3
	if c.CPU.ISAExt[0] != "avx2" || c.GPU.Vendor != "nvidia" || c.GPUs[0].Vendor != "amd" || c.Models[0].State != ModelWarm || c.Stages[0].Hi != 4 {
		t.Fatalf("mutating the original changed the clone: %+v", c)
	}
	var nilVec *Vector
	if nilVec.Clone() != nil {
		t.Fatalf("nil Clone is not nil")
	}
}

// TestClonePreservesSignedEncoding: a clone of a verified vector must still verify when it is
// encoded again, so the clone must keep empty-but-present slices (which encode as [] and are
// signed as []) apart from absent ones (null).
func TestClonePreservesSignedEncoding(t *testing.T) {
	cases := []struct {
		name string
		mut  func(*Vector)
	}{
		{"no gpu (null)", func(v *Vector) { v.GPU, v.GPUs = nil, nil }},
		{"no gpus list as []", func(v *Vector) { v.GPUs = []GPU{} }},
		{"no models as []", func(v *Vector) { v.Models = []Model{} }},
		{"no models as null", func(v *Vector) { v.Models = nil }},
		{"empty isa_ext", func(v *Vector) { v.CPU.ISAExt = []string{} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := signedVector(t, newKey(t), tc.mut)
			got, err := Verify(marshal(t, v), testNow())
			if err != nil {
				t.Fatalf("Verify of the original: %v", err)
			}
			c := got.Clone()
			if !bytes.Equal(canonical(t, c), canonical(t, got)) {
				t.Fatalf("the clone's canonical bytes differ from the original's")
			}
			if _, err = Verify(marshal(t, c), testNow()); err != nil {
				t.Fatalf("Verify of the re-encoded clone: %v", err)
			}
		})
	}
}

// boundsCase is a change that takes a valid vector outside the documented bounds.
type boundsCase struct {
	name string
	mut  func(*Vector)
}

// stages returns n distinct warm layer ranges of v's first model.
func stages(v *Vector, n int) []Stage {
	out := make([]Stage, n)
	for i := range out {
		out[i] = Stage{Model: v.Models[0].Name, Lo: i, Hi: i + 1, State: StageWarm}
	}
	return out
}

// outOfBounds lists impossible values that are still valid JSON, so each can be signed
// correctly and must be refused for the bound alone.
func outOfBounds() []boundsCase {
	models := func(n int) []Model {
		ms := make([]Model, n)
		for i := range ms {
			ms[i] = Model{Name: "model-" + string(rune('a'+i/26)) + string(rune('a'+i%26)), State: ModelCold}
		}
		return ms
	}
	other := func(v *Vector) *GPU { return &v.GPUs[0] } // the integrated GPU, not the primary
	return []boundsCase{
		{"peer_id empty", func(v *Vector) { v.PeerID = "" }},
		{"runtime unknown", func(v *Vector) { v.Runtime = "mainframe" }},
		{"runtime empty", func(v *Vector) { v.Runtime = "" }},
		{"runtime upper case", func(v *Vector) { v.Runtime = "Desktop" }},
		{"runtime an OS name", func(v *Vector) { v.Runtime = "linux" }},
		{"cores 0", func(v *Vector) { v.CPU.Cores = 0 }},
		{"cores negative", func(v *Vector) { v.CPU.Cores = -8 }},
		{"cores over max", func(v *Vector) { v.CPU.Cores = MaxCores + 1 }},
		{"cpu arch empty", func(v *Vector) { v.CPU.Arch = "" }},
		{"cpu model too long", func(v *Vector) { v.CPU.Model = strings.Repeat("x", MaxString+1) }},
		{"cpu model control char", func(v *Vector) { v.CPU.Model = "ryzen\x00" }},
		{"isa_ext over max", func(v *Vector) { v.CPU.ISAExt = make([]string, MaxISA+1); fill(v.CPU.ISAExt, "sse") }},
		{"isa_ext entry empty", func(v *Vector) { v.CPU.ISAExt = []string{"avx2", ""} }},
		{"isa_ext entry too long", func(v *Vector) { v.CPU.ISAExt = []string{strings.Repeat("a", MaxString+1)} }},
		{"gpu vendor empty", func(v *Vector) { editGPU(v, func(g *GPU) { g.Vendor = "" }) }},
		{"gpu model too long", func(v *Vector) { editGPU(v, func(g *GPU) { g.Model = strings.Repeat("g", MaxString+1) }) }},
		{"gpu vram 10 PB", func(v *Vector) { editGPU(v, func(g *GPU) { g.VRAMMB = 10 << 30 }) }},
		{"gpu vram over 1 TiB", func(v *Vector) { editGPU(v, func(g *GPU) { g.VRAMMB = MaxVRAMMB + 1 }) }},
		{"gpu vram negative", func(v *Vector) { editGPU(v, func(g *GPU) { g.VRAMMB = -1 }) }},
		{"gpu vram out of bounds without gpus", func(v *Vector) { v.GPUs = nil; v.GPU.VRAMMB = MaxVRAMMB + 1 }},
		{"gpu null with gpus listed", func(v *Vector) { v.GPU = nil }},
		{"gpu not one of gpus", func(v *Vector) { v.GPU = &GPU{Vendor: "nvidia", Model: "NVIDIA H100", VRAMMB: 81_559} }},
		{"gpus count over max", func(v *Vector) { v.GPUs = make([]GPU, MaxGPUs+1); fill(v.GPUs, *v.GPU) }},
		{"gpus entry vendor empty", func(v *Vector) { other(v).Vendor = "" }},
		{"gpus entry vram negative", func(v *Vector) { other(v).VRAMMB = -1 }},
		{"gpus entry model control char", func(v *Vector) { other(v).Model = "radeon\n" }},
		{"npu vendor too long", func(v *Vector) { v.NPU.Vendor = strings.Repeat("n", MaxString+1) }},
		{"npu vendor delete char", func(v *Vector) { v.NPU.Vendor = "amd\x7f" }},
		{"npu vendor without npu", func(v *Vector) { v.NPU = NPU{Vendor: "intel"} }},
		{"ram total 0", func(v *Vector) { v.RAM = RAM{TotalMB: 0, FreeMB: 0} }},
		{"ram total over 64 TiB", func(v *Vector) { v.RAM = RAM{TotalMB: MaxRAMMB + 1, FreeMB: 1} }},
		{"ram free over total", func(v *Vector) { v.RAM.FreeMB = v.RAM.TotalMB + 1 }},
		{"ram free negative", func(v *Vector) { v.RAM.FreeMB = -1 }},
		{"battery level over 1", func(v *Vector) { v.Battery.Level = 1.01 }},
		{"battery level in percent", func(v *Vector) { v.Battery.Level = 87 }},
		{"battery level negative", func(v *Vector) { v.Battery.Level = -0.01 }},
		{"battery floor over 1", func(v *Vector) { v.Battery.Floor = 1.5 }},
		{"battery floor in percent", func(v *Vector) { v.Battery.Floor = 30 }},
		{"battery floor negative", func(v *Vector) { v.Battery.Floor = -0.1 }},
		{"battery level without battery", func(v *Vector) { v.Battery = Battery{Level: 0.5} }},
		{"battery charging without battery", func(v *Vector) { v.Battery = Battery{Charging: true} }},
		{"thermal unknown", func(v *Vector) { v.Thermal = "hot" }},
		{"thermal empty", func(v *Vector) { v.Thermal = "" }},
		{"app_state unknown", func(v *Vector) { v.AppState = "gaming" }},
		{"app_state empty", func(v *Vector) { v.AppState = "" }},
		{"app_state caps/1 active", func(v *Vector) { v.AppState = "active" }},
		{"app_state caps/1 idle", func(v *Vector) { v.AppState = "idle" }},
		{"app_state background on a desktop", func(v *Vector) { v.AppState = AppStateBackground }},
		{"app_state background-task on a desktop", func(v *Vector) { v.AppState = AppStateBackgroundTask }},
		{"net.type unknown", func(v *Vector) { v.Net.Type = "5g" }},
		{"net.type empty", func(v *Vector) { v.Net.Type = "" }},
		{"net.type an effective type", func(v *Vector) { v.Net.Type = "4g" }},
		{"net.type spelled Wi-Fi", func(v *Vector) { v.Net.Type = "Wi-Fi" }},
		{"rtt negative", func(v *Vector) { v.Net.RTTMS = -1 }},
		{"rtt over a minute", func(v *Vector) { v.Net.RTTMS = MaxRTTMS + 0.5 }},
		{"downlink negative (negative throughput)", func(v *Vector) { v.Net.DownlinkMbps = -0.5 }},
		{"downlink over 1 Tbit/s", func(v *Vector) { v.Net.DownlinkMbps = MaxDownlinkMbps * 2 }},
		{"65 models", func(v *Vector) { v.Models = models(MaxModels + 1) }},
		{"duplicate model names", func(v *Vector) { v.Models[1].Name = v.Models[0].Name }},
		{"model name empty", func(v *Vector) { v.Models[0].Name = "" }},
		{"model name too long", func(v *Vector) { v.Models[0].Name = strings.Repeat("m", MaxString+1) }},
		{"model name newline", func(v *Vector) { v.Models[0].Name = "llama\n" }},
		{"model name replacement char", func(v *Vector) { v.Models[0].Name = "llama\ufffd" }},
		{"model state unknown", func(v *Vector) { v.Models[0].State = "hot" }},
		{"model layers negative", func(v *Vector) { v.Models[0].Layers, v.Models[0].WeightBytes = -1, 1 }},
		{"model layers over MaxLayers", func(v *Vector) { v.Models[0].Layers, v.Models[0].WeightBytes = MaxLayers+1, 1 }},
		{"model weight bytes without layers", func(v *Vector) { v.Models[0].WeightBytes = 1 << 20 }},
		{"model layers without weight bytes", func(v *Vector) { v.Models[0].Layers = 8 }},
		{"model weight bytes over the bound", func(v *Vector) { v.Models[0].Layers, v.Models[0].WeightBytes = 8, MaxModelBytes+1 }},
		{"model kv over its weights", func(v *Vector) {
			v.Models[0].Layers, v.Models[0].WeightBytes, v.Models[0].KVBytesPerToken = 8, 1<<20, 1<<21
		}},
		{"ram budget over total", func(v *Vector) { v.RAM.BudgetMB = v.RAM.TotalMB + 1 }},
		{"65 stages", func(v *Vector) { v.Stages = stages(v, MaxStages+1) }},
		{"stage of a model not announced", func(v *Vector) { v.Stages = []Stage{{Model: "other", Lo: 0, Hi: 4, State: StageWarm}} }},
		{"stage without a model", func(v *Vector) { v.Stages = []Stage{{Lo: 0, Hi: 4, State: StageWarm}} }},
		{"stage lo negative", func(v *Vector) { v.Stages = []Stage{{Model: v.Models[0].Name, Lo: -1, Hi: 4, State: StageWarm}} }},
		{"stage empty range", func(v *Vector) { v.Stages = []Stage{{Model: v.Models[0].Name, Lo: 4, Hi: 4, State: StageWarm}} }},
		{"stage range backwards", func(v *Vector) { v.Stages = []Stage{{Model: v.Models[0].Name, Lo: 8, Hi: 4, State: StageWarm}} }},
		{"stage hi over MaxLayers", func(v *Vector) {
			v.Stages = []Stage{{Model: v.Models[0].Name, Lo: 0, Hi: MaxLayers + 1, State: StageWarm}}
		}},
		{"stage hi over the model's layers", func(v *Vector) {
			v.Models[0].Layers, v.Models[0].WeightBytes = 16, 480<<20
			v.Stages = []Stage{{Model: v.Models[0].Name, Lo: 8, Hi: 17, State: StageWarm}}
		}},
		{"stage state unknown", func(v *Vector) { v.Stages = []Stage{{Model: v.Models[0].Name, Lo: 0, Hi: 4, State: "hot"}} }},
		{"stage state a model's cold", func(v *Vector) { v.Stages = []Stage{{Model: v.Models[0].Name, Lo: 0, Hi: 4, State: ModelCold}} }},
		{"stage state empty", func(v *Vector) { v.Stages = []Stage{{Model: v.Models[0].Name, Lo: 0, Hi: 4}} }},
		{"stage listed twice", func(v *Vector) {
			st := Stage{Model: v.Models[0].Name, Lo: 0, Hi: 4, State: StageWarm}
			v.Stages = []Stage{st, st}
		}},
		{"stage listed twice in two states", func(v *Vector) {
			v.Stages = []Stage{{Model: v.Models[0].Name, Lo: 0, Hi: 4, State: StageWarm}, {Model: v.Models[0].Name, Lo: 0, Hi: 4, State: StageLoading}}
		}},
		{"ram budget negative", func(v *Vector) { v.RAM.BudgetMB = -1 }},
		{"in_flight negative", func(v *Vector) { v.Load.InFlight = -1 }},
		{"capacity negative", func(v *Vector) { v.Load.Capacity = -1 }},
		{"queue over max", func(v *Vector) { v.Load.Queue = MaxLoad + 1 }},
		{"seq 0", func(v *Vector) { v.Seq = 0 }},
		{"ttl over MaxTTL", func(v *Vector) { v.Expires = v.IssuedAt + MaxTTL.Milliseconds() + 1 }},
		{"ttl 0", func(v *Vector) { v.Expires = v.IssuedAt }},
		{"expires before issued", func(v *Vector) { v.Expires = v.IssuedAt - 1 }},
		{"issued_at 0", func(v *Vector) { v.IssuedAt, v.Expires = 0, 45_000 }},
		{"issued_at negative", func(v *Vector) { v.IssuedAt, v.Expires = -1000, 44_000 }},
		{"ttl overflowing int64", func(v *Vector) { v.IssuedAt, v.Expires = 1, math.MinInt64 }},
	}
}

func fill[T any](s []T, x T) {
	for i := range s {
		s[i] = x
	}
}

func TestValidate(t *testing.T) {
	base := func() *Vector {
		v := validVector(testNow())
		v.PeerID = "12D3KooWK99VoVxNE7XzyBwXEzW7xhK7Gpv85r9F3V3fyKSUKPH5"
		return v
	}
	if err := base().Validate(); err != nil {
		t.Fatalf("base vector: %v", err)
	}
	bad := append(outOfBounds(),
		// Not encodable as JSON, so only reachable through Validate.
		boundsCase{"rtt NaN", func(v *Vector) { v.Net.RTTMS = math.NaN() }},
		boundsCase{"rtt +Inf", func(v *Vector) { v.Net.RTTMS = math.Inf(1) }},
		boundsCase{"downlink NaN", func(v *Vector) { v.Net.DownlinkMbps = math.NaN() }},
		boundsCase{"downlink -Inf", func(v *Vector) { v.Net.DownlinkMbps = math.Inf(-1) }},
		boundsCase{"battery level NaN", func(v *Vector) { v.Battery.Level = math.NaN() }},
		boundsCase{"battery floor +Inf", func(v *Vector) { v.Battery.Floor = math.Inf(1) }},
	)
	for _, tc := range bad {
		t.Run("reject/"+tc.name, func(t *testing.T) {
			v := base()
			tc.mut(v)
			if err := v.Validate(); !errors.Is(err, ErrOutOfBounds) {
				t.Fatalf("Validate = %v, want ErrOutOfBounds", err)
			}
		})
	}
	good := []boundsCase{
		{"cores 1", func(v *Vector) { v.CPU.Cores = 1 }},
		{"model with its size", func(v *Vector) {
			v.Models[0].Layers, v.Models[0].WeightBytes, v.Models[0].KVBytesPerToken = 16, 480<<20, 96<<10
		}},
		{"ram budget all of it", func(v *Vector) { v.RAM.BudgetMB = v.RAM.TotalMB }},
		{"cores max", func(v *Vector) { v.CPU.Cores = MaxCores }},
		{"no isa_ext", func(v *Vector) { v.CPU.ISAExt = nil }},
		{"isa_ext max", func(v *Vector) { v.CPU.ISAExt = make([]string, MaxISA); fill(v.CPU.ISAExt, "sse") }},
		{"cpu model max length", func(v *Vector) { v.CPU.Model = strings.Repeat("x", MaxString) }},
		{"cpu model non-ascii", func(v *Vector) { v.CPU.Model = "Apple M3 Max — 16 cœurs" }},
		{"cpu model unknown", func(v *Vector) { v.CPU.Model = "" }},
		{"no gpu", func(v *Vector) { v.GPU, v.GPUs = nil, nil }},
		{"gpu without a gpus list", func(v *Vector) { v.GPUs = nil }},
		{"gpus max", func(v *Vector) { v.GPUs = make([]GPU, MaxGPUs); fill(v.GPUs, *v.GPU) }},
		{"gpu vram unknown", func(v *Vector) { editGPU(v, func(g *GPU) { g.VRAMMB = 0 }) }},
		{"gpu vram max", func(v *Vector) { editGPU(v, func(g *GPU) { g.VRAMMB = MaxVRAMMB }) }},
		{"gpu model unknown", func(v *Vector) { editGPU(v, func(g *GPU) { g.Model = "" }) }},
		{"gpu through webgpu", func(v *Vector) { editGPU(v, func(g *GPU) { g.WebGPU = true }) }},
		{"gpu stale", func(v *Vector) { editGPU(v, func(g *GPU) { g.Stale = true }) }},
		{"no npu", func(v *Vector) { v.NPU = NPU{} }},
		{"npu of unknown vendor", func(v *Vector) { v.NPU = NPU{Present: true} }},
		{"ram max", func(v *Vector) { v.RAM = RAM{TotalMB: MaxRAMMB, FreeMB: MaxRAMMB} }},
		{"ram 1 MiB none free", func(v *Vector) { v.RAM = RAM{TotalMB: 1, FreeMB: 0} }},
		{"no battery", func(v *Vector) { v.Battery = Battery{} }},
		{"no battery, floor said", func(v *Vector) { v.Battery = Battery{Floor: 0.3} }},
		{"battery empty", func(v *Vector) { v.Battery = Battery{Present: true, Level: 0} }},
		{"battery full", func(v *Vector) { v.Battery = Battery{Present: true, Level: 1, Charging: true} }},
		{"battery floor 0", func(v *Vector) { v.Battery.Floor = 0 }},
		{"battery floor 1", func(v *Vector) { v.Battery.Floor = 1 }},
		{"battery level 1 %", func(v *Vector) { v.Battery.Level = 0.01 }},
		{"thermal fair", func(v *Vector) { v.Thermal = ThermalFair }},
		{"thermal serious", func(v *Vector) { v.Thermal = ThermalSerious }},
		{"thermal critical", func(v *Vector) { v.Thermal = ThermalCritical }},
		{"rtt max", func(v *Vector) { v.Net.RTTMS = MaxRTTMS }},
		{"rtt and downlink unknown", func(v *Vector) { v.Net.RTTMS, v.Net.DownlinkMbps = 0, 0 }},
		{"downlink max", func(v *Vector) { v.Net.DownlinkMbps = MaxDownlinkMbps }},
		{"metered", func(v *Vector) { v.Net.Metered = true }},
		{"no models", func(v *Vector) { v.Models = nil }},
		{"64 models", func(v *Vector) {
			v.Models = make([]Model, MaxModels)
			for i := range v.Models {
				v.Models[i] = Model{Name: strings.Repeat("m", i+1), State: ModelWarm}
			}
		}},
		{"no stages as []", func(v *Vector) { v.Stages = []Stage{} }},
		{"stages loading and warm", func(v *Vector) {
			v.Stages = []Stage{{Model: v.Models[0].Name, Lo: 0, Hi: 8, State: StageLoading}, {Model: v.Models[1].Name, Lo: 8, Hi: 16, State: StageWarm}}
		}},
		{"stages overlapping", func(v *Vector) {
			v.Stages = []Stage{{Model: v.Models[0].Name, Lo: 0, Hi: 8, State: StageWarm}, {Model: v.Models[0].Name, Lo: 4, Hi: 8, State: StageWarm}}
		}},
		{"stage up to the model's last layer", func(v *Vector) {
			v.Models[0].Layers, v.Models[0].WeightBytes = 16, 480<<20
			v.Stages = []Stage{{Model: v.Models[0].Name, Lo: 8, Hi: 16, State: StageWarm}}
		}},
		{"stage up to MaxLayers of a model of unsaid size", func(v *Vector) {
			v.Stages = []Stage{{Model: v.Models[0].Name, Lo: MaxLayers - 1, Hi: MaxLayers, State: StageLoading}}
		}},
		{"64 stages", func(v *Vector) { v.Stages = stages(v, MaxStages) }},
		{"load max", func(v *Vector) { v.Load = Load{InFlight: MaxLoad, Capacity: MaxLoad, Queue: MaxLoad} }},
		{"ttl 1 ms", func(v *Vector) { v.Expires = v.IssuedAt + 1 }},
		{"ttl MaxTTL", func(v *Vector) { v.Expires = v.IssuedAt + MaxTTL.Milliseconds() }},
		{"seq max", func(v *Vector) { v.Seq = math.MaxUint64 }},
	}
	for _, rt := range []string{RuntimeBrowser, RuntimeIOS, RuntimeAndroid} {
		for _, st := range []string{AppStateForeground, AppStateBackgroundTask, AppStateBackground} {
			good = append(good, boundsCase{"runtime " + rt + " in " + st, func(v *Vector) { v.Runtime, v.AppState = rt, st }})
		}
	}
	for _, typ := range []string{NetBluetooth, NetCellular, NetEthernet, NetMixed, NetNone, NetOther, NetUnknown, NetWiFi, NetWiMAX} {
		good = append(good, boundsCase{"net.type " + typ, func(v *Vector) { v.Net.Type = typ }})
	}
	for _, tc := range good {
		t.Run("accept/"+tc.name, func(t *testing.T) {
			v := base()
			tc.mut(v)
			if err := v.Validate(); err != nil {
				t.Fatalf("Validate = %v, want nil", err)
			}
		})
	}
}
