package probe

import (
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

// vectorOf is h.Vector() with the fields the announcer fills, so Validate judges h alone.
func vectorOf(h Hardware) *caps.Vector {
	v := h.Vector()
	v.PeerID, v.Seq, v.IssuedAt, v.Expires = "12D3KooWprobe", 1, 1, 2
	return &v
}

func TestNewRejectsBadOptions(t *testing.T) {
	for name, opt := range map[string]Option{
		"empty root":      WithRoot(""),
		"zero refresh":    WithGPURefresh(0),
		"negative timout": WithGPUTimeout(-time.Second),
	} {
		if p, err := New(opt); err == nil {
			p.Close()
			t.Fatalf("%s: New succeeded", name)
		}
	}
}

func TestProbeFakeTree(t *testing.T) {
	files := map[string]string{
		"proc/cpuinfo":                                      cpuinfoX86,
		"proc/meminfo":                                      meminfo,
		"sys/class/power_supply/BAT0/type":                  "Battery\n",
		"sys/class/power_supply/BAT0/capacity":              "42\n",
		"sys/class/power_supply/BAT0/status":                "Discharging\n",
		"sys/class/power_supply/AC/type":                    "Mains\n",
		"sys/class/power_supply/AC/online":                  "0\n",
		"sys/class/thermal/thermal_zone0/temp":              "72000\n",
		"sys/class/thermal/thermal_zone0/trip_point_0_type": "critical\n",
		"sys/class/thermal/thermal_zone0/trip_point_0_temp": "100000\n",
		"dev/accel/accel0":                                  "",
	}
	for k, v := range gpuTreeFiles {
		files[k] = v
	}
	p := newProber(t, WithRoot(newTree(t, files)), WithGPUCommand(fakeCommand(t, smi4090)))
	st := waitGPU(t, p, refreshed(1))
	h := p.Probe(st.at)

	if h.CPU.Cores != 2 || h.CPU.Arch != runtime.GOARCH || h.CPU.Model != "Intel(R) Xeon(R) Platinum 8480+" || len(h.CPU.ISAExt) != 14 {
		t.Fatalf("cpu = %+v", h.CPU)
	}
	wantGPUs(t, h.GPU, gpuIntel, gpu4090, gpuAMD, gpuOther)
	if h.NPU != (caps.NPU{Present: true}) {
		t.Fatalf("npu = %+v", h.NPU)
	}
	if h.RAM != (caps.RAM{TotalMB: 15936, FreeMB: 7968}) {
		t.Fatalf("ram = %+v", h.RAM)
	}
	if h.Battery != (caps.Battery{Present: true, Level: 0.42}) {
		t.Fatalf("battery = %+v", h.Battery)
	}
	if h.Thermal != caps.ThermalFair {
		t.Fatalf("thermal = %q", h.Thermal)
	}
	if err := vectorOf(h).Validate(); err != nil {
		t.Fatalf("probed vector invalid: %v", err)
	}

	// Probe hands out copies.
	h.CPU.ISAExt[0] = "mutated"
	h.GPU[0].Model = "mutated"
	again := p.Probe(st.at)
	if again.CPU.ISAExt[0] == "mutated" || again.GPU[0].Model == "mutated" {
		t.Fatal("Probe returned shared slices")
	}
}

func TestProbeGarbageTreeDoesNotPanic(t *testing.T) {
	junk := "\x00\xff\xfe:::\n" + strings.Repeat("9", 40) + "\n:\n\xff"
	files := map[string]string{}
	for _, p := range []string{
		"proc/cpuinfo", "proc/meminfo",
		"sys/class/power_supply/BAT0/type", "sys/class/power_supply/BAT0/capacity",
		"sys/class/power_supply/BAT0/status", "sys/class/power_supply/BAT0/scope",
		"sys/class/thermal/thermal_zone0/temp", "sys/class/thermal/thermal_zone0/trip_point_0_type",
		pci + "0000:01:00.0/class", pci + "0000:01:00.0/vendor", pci + "0000:01:00.0/mem_info_vram_total",
	} {
		files[p] = junk
	}
	// Truncated variants: half a line, no newline.
	files["sys/class/power_supply/BAT1/type"] = "Batt"
	files["sys/class/thermal/thermal_zone1/temp"] = "7"
	files[pci+"0000:02:00.0/class"] = "0x03"
	root := newTree(t, files)
	// A directory where a file should be, and a dangling link.
	for _, d := range []string{"sys/class/power_supply/BAT2/type", "sys/class/thermal/thermal_zone2/temp"} {
		if err := os.MkdirAll(root+"/"+d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/nonexistent", root+"/sys/class/power_supply/dangling"); err != nil {
		t.Fatal(err)
	}

	p := newProber(t, WithRoot(root), WithGPUCommand(fakeCommand(t, "head -c 100000 /dev/urandom")))
	st := waitGPU(t, p, refreshed(1))
	h := p.Probe(st.at)
	v := vectorOf(h)
	if v.RAM.TotalMB == 0 {
		v.RAM = caps.RAM{TotalMB: 1} // unknown RAM is the documented default, which Validate refuses
	}
	if err := v.Validate(); err != nil {
		t.Fatalf("vector from a garbage tree invalid: %v (%+v)", err, h)
	}
}

func TestProbeRealRoot(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads Linux procfs")
	}
	p := newProber(t)
	h := p.Probe(time.Now())
	t.Logf("real hardware: %+v", h)
	if h.CPU.Cores < 1 || h.RAM.TotalMB <= 0 {
		t.Fatalf("cores %d, ram %d MiB: want both positive", h.CPU.Cores, h.RAM.TotalMB)
	}
	if err := vectorOf(h).Validate(); err != nil {
		t.Fatalf("probed vector invalid: %v", err)
	}
}

func TestProbeConcurrent(t *testing.T) {
	root := newTree(t, gpuTreeFiles)
	p := newProber(t, WithRoot(root), WithGPUCommand(fakeCommand(t, smi4090)), WithGPURefresh(time.Millisecond))
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 50 {
				p.Probe(time.Now())
			}
		})
	}
	wg.Wait()
}

func TestCloseStopsRefresh(t *testing.T) {
	base := runtime.NumGoroutine()
	p, err := New(WithRoot(newTree(t, gpuTreeFiles)), WithGPUCommand(fakeCommand(t, smi4090)), WithGPURefresh(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	waitGPU(t, p, refreshed(3))
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	waitFor(t, "the loop's goroutines to end", func() bool { return runtime.NumGoroutine() <= base })

	// Probe still answers after Close.
	if h := p.Probe(time.Now()); len(h.GPU) != 4 {
		t.Fatalf("gpu after Close = %+v", h.GPU)
	}
}

func TestCloseKillsRunningCommand(t *testing.T) {
	base := runtime.NumGoroutine()
	started := t.TempDir() + "/started"
	cmd := fakeCommand(t, `touch "`+started+`"; exec sleep 10`)
	p, err := New(WithRoot(newTree(t, gpuTreeFiles)), WithGPUCommand(cmd), WithGPUTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, started+" to appear", func() bool { _, err := os.Stat(started); return err == nil })
	var wg sync.WaitGroup
	for range 2 { // concurrent Closes both return once the loop is gone
		wg.Go(func() { p.Close() })
	}
	wg.Wait()
	waitFor(t, "the loop's goroutines to end", func() bool { return runtime.NumGoroutine() <= base })
	p.mu.Lock()
	refreshes := p.gpu.refreshes
	p.mu.Unlock()
	if refreshes != 0 {
		t.Fatalf("refreshes = %d after Close interrupted the first, want 0", refreshes)
	}
}

// TestHardwareVector: the desktop's vector names the GPU with the most VRAM (the first on a
// tie) as gpu and lists every GPU in gpus; it is a foreground desktop on its link type.
func TestHardwareVector(t *testing.T) {
	igpu := caps.GPU{Vendor: "intel", Model: "Iris Xe"}
	small := caps.GPU{Vendor: "amd", Model: "Radeon 780M", VRAMMB: 512}
	big := caps.GPU{Vendor: "nvidia", Model: "RTX 4090", VRAMMB: 24_564}
	twin := caps.GPU{Vendor: "nvidia", Model: "RTX 4090 #2", VRAMMB: 24_564}
	base := Hardware{
		CPU:     caps.CPU{Cores: 8, Arch: "amd64", ISAExt: []string{"avx2"}},
		RAM:     caps.RAM{TotalMB: 16_000, FreeMB: 8_000},
		Battery: caps.Battery{Present: true, Level: 0.42},
		Thermal: caps.ThermalFair,
		NetType: caps.NetCellular, Metered: true,
	}
	tests := []struct {
		name string
		gpus []caps.GPU
		want *caps.GPU
	}{
		{"no gpu", nil, nil},
		{"one gpu", []caps.GPU{igpu}, &igpu},
		{"most vram wins", []caps.GPU{igpu, small, big}, &big},
		{"most vram wins wherever it is", []caps.GPU{big, igpu, small}, &big},
		{"first of a tie", []caps.GPU{igpu, big, twin}, &big},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := base
			h.GPU = tc.gpus
			v := h.Vector()
			if (v.GPU == nil) != (tc.want == nil) || v.GPU != nil && *v.GPU != *tc.want {
				t.Fatalf("gpu = %+v, want %+v", v.GPU, tc.want)
			}
			if len(v.GPUs) != len(tc.gpus) {
				t.Fatalf("gpus = %+v, want %+v", v.GPUs, tc.gpus)
			}
			if v.Runtime != caps.RuntimeDesktop || v.AppState != caps.AppStateForeground {
				t.Fatalf("runtime %q app_state %q, want a foreground desktop", v.Runtime, v.AppState)
			}
			if v.Net != (caps.Net{Type: caps.NetCellular, Metered: true}) || v.Battery != base.Battery || v.Thermal != base.Thermal {
				t.Fatalf("net %+v battery %+v thermal %q: not the hardware's", v.Net, v.Battery, v.Thermal)
			}
			if v.GPU != nil {
				v.GPU.Model = "changed" // the primary is a copy, not an alias into gpus
				for _, g := range v.GPUs {
					if g.Model == "changed" {
						t.Fatalf("gpu aliases an entry of gpus")
					}
				}
				v.GPU.Model = tc.want.Model
			}
			if err := vectorOf(h).Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
		})
	}
}
