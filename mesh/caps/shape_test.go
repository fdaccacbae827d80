package caps

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// caps1Wire is a vector as a caps/1 node sent it (the known answer of that version, signed
// under the v1 domain): gpu a list, cpu.isa, npu.model, battery.level in percent, app_state
// active and net.effective.
const caps1Wire = `{"peer_id":"12D3KooWK99VoVxNE7XzyBwXEzW7xhK7Gpv85r9F3V3fyKSUKPH5","runtime":"desktop",` +
	`"cpu":{"cores":16,"arch":"amd64","model":"AMD Ryzen 9 7940HS w/ Radeon 780M Graphics","isa":["avx2","avx512f","fma"]},` +
	`"gpu":[{"vendor":"nvidia","model":"NVIDIA GeForce RTX 4070 Laptop GPU","vram_mb":8188}],` +
	`"npu":{"present":true,"model":"AMD XDNA"},"ram":{"total_mb":31416,"free_mb":18230},` +
	`"battery":{"present":true,"level":87,"charging":true},"thermal":"nominal","app_state":"active",` +
	`"net":{"rtt_ms":23.5,"downlink_mbps":94.2,"effective":"4g","metered":false},` +
	`"models":[{"name":"llama-3.1-8b-instruct-q4_k_m","state":"warm"},{"name":"qwen2.5-7b-instruct-q4_k_m","state":"cold"},` +
	`{"name":"a\u003cb\u003e\u0026c","state":"cold"}],` +
	`"load":{"in_flight":1,"queue":0,"accepting":true},"seq":1,"issued_at":1800000000000,"expires_at":1800000045000,` +
	`"sig":"ed25519:pwNLlpaMRgpzTUDUuUXcxbkG6SGM/ea4EfJQMAak/IKMp2ArQNKrrge6iO1/cFLHyN566gbG3MplAld7KMFhDw=="}`

// TestMobileVectorsRoundTrip: phones and browsers announce valid vectors, which survive
// Sign, Encode and Verify unchanged, under the field names of the design.
func TestMobileVectorsRoundTrip(t *testing.T) {
	cases := []struct {
		name string
		mut  func(*Vector)
		want []string // fragments the wire form must hold
	}{
		{"android in a background task, charging at 42 % on metered cellular", nil, []string{
			`"runtime":"android"`,
			`"gpu":{"vendor":"qualcomm","model":"Adreno 740","vram_mb":0,"webgpu":false}`,
			`"npu":{"present":true,"vendor":"qualcomm"}`,
			`"battery":{"present":true,"level":0.42,"charging":true,"floor":0.3}`,
			`"thermal":"fair","app_state":"background-task"`,
			`"net":{"type":"cellular","rtt_ms":68,"downlink_mbps":12.5,"metered":true}`,
		}},
		{"ios in the background", func(v *Vector) {
			v.Runtime, v.AppState = RuntimeIOS, AppStateBackground
			v.CPU = CPU{Cores: 6, Arch: "arm64", Model: "Apple A17 Pro"}
			v.GPU, v.NPU = &GPU{Vendor: "apple", Model: "Apple A17 Pro GPU"}, NPU{Present: true, Vendor: "apple"}
			v.Battery = Battery{Present: true, Level: 0.9, Floor: 0.5}
			v.Net = Net{Type: NetWiFi, RTTMS: 12, DownlinkMbps: 200}
		}, []string{`"runtime":"ios"`, `"app_state":"background"`, `"level":0.9,"charging":false,"floor":0.5`, `"type":"wifi"`}},
		{"browser with WebGPU", func(v *Vector) {
			v.Runtime, v.AppState = RuntimeBrowser, AppStateForeground
			v.CPU = CPU{Cores: 8, Arch: "wasm"}
			v.GPU, v.NPU = &GPU{Vendor: "intel", Model: "Intel Iris Xe", WebGPU: true}, NPU{}
			v.Battery = Battery{}
			v.Net = Net{Type: NetUnknown, RTTMS: 50, DownlinkMbps: 10}
		}, []string{`"runtime":"browser"`, `"webgpu":true`, `"npu":{"present":false,"vendor":""}`, `"type":"unknown"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := mobileVector(testNow())
			if tc.mut != nil {
				tc.mut(v)
			}
			if err := Sign(newKey(t), v); err != nil {
				t.Fatalf("Sign: %v", err)
			}
			if err := v.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			data, err := Encode(v)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			for _, w := range tc.want {
				if !bytes.Contains(data, []byte(w)) {
					t.Errorf("wire form lacks %s:\n%s", w, data)
				}
			}
			if bytes.Contains(data, []byte(`"gpus"`)) {
				t.Errorf("wire form lists gpus, which a phone or browser leaves out:\n%s", data)
			}
			got, err := Verify(data, testNow())
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if !reflect.DeepEqual(got, v) {
				t.Fatalf("Verify returned\n%+v\nwant\n%+v", got, v)
			}
		})
	}
}

// TestOldShapeRefused: a caps/1 vector reaching a caps/2 receiver is refused, and the error
// says it is the old shape and what gave it away; other refusals do not claim so.
func TestOldShapeRefused(t *testing.T) {
	key := newKey(t)
	noGPU := strings.Replace(caps1Wire, `[{"vendor":"nvidia","model":"NVIDIA GeForce RTX 4070 Laptop GPU","vram_mb":8188}]`, `null`, 1)
	noGPU = strings.Replace(noGPU, `,"isa":["avx2","avx512f","fma"]`, ``, 1)
	noGPU = strings.Replace(noGPU, `,"model":"AMD XDNA"`, ``, 1)
	cases := []struct {
		name  string
		data  []byte
		layer error    // ErrMalformed or ErrOutOfBounds
		marks []string // what the error must name; nil: not the old shape
	}{
		{"caps/1 vector as sent", []byte(caps1Wire), ErrMalformed,
			[]string{"gpu is a list", "cpu.isa", "npu.model", "battery.level 87 in percent", `app_state "active"`, "net.effective"}},
		{"caps/1 vector without a gpu", []byte(noGPU), ErrMalformed,
			[]string{"net.effective", `app_state "active"`, "battery.level 87 in percent"}},
		{"new shape, battery in percent", marshal(t, signedVector(t, key, func(v *Vector) { v.Battery.Level = 87 })), ErrOutOfBounds,
			[]string{"battery.level 87 in percent"}},
		{"new shape, app_state idle", marshal(t, signedVector(t, key, func(v *Vector) { v.AppState = "idle" })), ErrOutOfBounds,
			[]string{`app_state "idle"`}},
		{"new shape, gpu a list", bytes.Replace(marshal(t, signedVector(t, key, func(v *Vector) { v.GPUs = nil })),
			[]byte(`"gpu":{"vendor":"nvidia","model":"NVIDIA GeForce RTX 4070 Laptop GPU","vram_mb":8188,"webgpu":false}`),
			[]byte(`"gpu":[{"vendor":"nvidia","model":"NVIDIA GeForce RTX 4070 Laptop GPU","vram_mb":8188,"webgpu":false}]`), 1),
			ErrMalformed, []string{"gpu is a list"}},
		{"battery level 1.5 is not a percentage", marshal(t, signedVector(t, key, func(v *Vector) { v.Battery.Level = 1.5 })),
			ErrOutOfBounds, nil},
		{"unknown field", bytes.Replace(marshal(t, signedVector(t, key, nil)), []byte(`{`), []byte(`{"extra":1,`), 1),
			ErrMalformed, nil},
		{"not JSON", []byte("hello"), ErrMalformed, nil},
		{"net.type missing", marshal(t, signedVector(t, key, func(v *Vector) { v.Net.Type = "" })), ErrOutOfBounds, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, derr := Decode(tc.data)
			_, verr := Verify(tc.data, testNow())
			for _, err := range []error{derr, verr} {
				if !errors.Is(err, tc.layer) {
					t.Fatalf("err = %v, want %v", err, tc.layer)
				}
				if old := errors.Is(err, ErrOldShape); old != (tc.marks != nil) {
					t.Fatalf("errors.Is(%v, ErrOldShape) = %v, want %v", err, old, tc.marks != nil)
				}
				for _, m := range append(tc.marks, "caps/1", "upgrade") {
					if tc.marks != nil && !strings.Contains(err.Error(), m) {
						t.Errorf("err %q does not mention %q", err, m)
					}
				}
			}
		})
	}
}
