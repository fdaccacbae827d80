package probe

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

const pci = "sys/bus/pci/devices/"

// gpuTreeFiles is a machine with a host bridge, an Intel iGPU, an NVIDIA dGPU, an AMD card and an
// unknown display controller, in PCI address order.
var gpuTreeFiles = map[string]string{
	pci + "0000:00:00.0/class":               "0x060000\n",
	pci + "0000:00:00.0/vendor":              "0x8086\n",
	pci + "0000:00:02.0/class":               "0x030000\n",
	pci + "0000:00:02.0/vendor":              "0x8086\n",
	pci + "0000:01:00.0/class":               "0x030000\n",
	pci + "0000:01:00.0/vendor":              "0x10de\n",
	pci + "0000:01:00.1/class":               "0x040300\n", // its HDMI audio function
	pci + "0000:01:00.1/vendor":              "0x10de\n",
	pci + "0000:03:00.0/class":               "0x030000\n",
	pci + "0000:03:00.0/vendor":              "0x1002\n",
	pci + "0000:03:00.0/mem_info_vram_total": "17163091968\n",
	pci + "0000:03:00.0/product_name":        "AMD Radeon RX 7800 XT\n",
	pci + "0000:04:00.0/class":               "0x038000\n",
	pci + "0000:04:00.0/vendor":              "0x1234\n",
	pci + "0000:05:00.0/class":               "0x120000\n", // processing accelerator: not a GPU
	pci + "0000:05:00.0/vendor":              "0x1002\n",
}

var (
	gpuIntel  = caps.GPU{Vendor: "intel"}
	gpuNVSys  = caps.GPU{Vendor: "nvidia"}
	gpuAMD    = caps.GPU{Vendor: "amd", Model: "AMD Radeon RX 7800 XT", VRAMMB: 16368}
	gpuOther  = caps.GPU{Vendor: "other"}
	gpu4090   = caps.GPU{Vendor: "nvidia", Model: "NVIDIA GeForce RTX 4090", VRAMMB: 24564}
	smi4090   = `echo "NVIDIA GeForce RTX 4090, 24564"`
	queryArgs = `[ "$1" = --query-gpu=name,memory.total ] && [ "$2" = --format=csv,noheader,nounits ] || exit 9`
)

func wantGPUs(t *testing.T, got []caps.GPU, want ...caps.GPU) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("gpu = %+v\nwant  %+v", got, want)
	}
}

func stale(g caps.GPU) caps.GPU {
	g.Stale = true
	return g
}

func TestGPUSysfsOnly(t *testing.T) {
	p := newProber(t, WithRoot(newTree(t, gpuTreeFiles)), WithGPUCommand(""))
	st := waitGPU(t, p, refreshed(1))
	wantGPUs(t, p.Probe(st.at).GPU, gpuIntel, gpuNVSys, gpuAMD, gpuOther)
}

func TestGPUNVIDIASMI(t *testing.T) {
	cmd := fakeCommand(t, queryArgs+"\n"+smi4090)
	p := newProber(t, WithRoot(newTree(t, gpuTreeFiles)), WithGPUCommand(cmd))
	st := waitGPU(t, p, refreshed(1))
	if st.err != nil {
		t.Fatalf("refresh error: %v", st.err)
	}
	wantGPUs(t, p.Probe(st.at).GPU, gpuIntel, gpu4090, gpuAMD, gpuOther)

	// Older than twice the refresh period at now: every entry is stale.
	wantGPUs(t, p.Probe(st.at.Add(2*DefaultGPURefresh+time.Millisecond)).GPU,
		stale(gpuIntel), stale(gpu4090), stale(gpuAMD), stale(gpuOther))
}

func TestGPUSlowCommandTimesOut(t *testing.T) {
	cmd := fakeCommand(t, "exec sleep 10")
	p := newProber(t, WithRoot(newTree(t, gpuTreeFiles)), WithGPUCommand(cmd), WithGPUTimeout(200*time.Millisecond))

	// While the command runs, Probe answers from the PCI scan with the NVIDIA entry stale.
	st := waitGPU(t, p, func(st gpuState) bool { return !st.at.IsZero() })
	if st.refreshes == 0 {
		wantGPUs(t, p.Probe(st.at).GPU, gpuIntel, stale(gpuNVSys), gpuAMD, gpuOther)
	}

	st = waitGPU(t, p, refreshed(1))
	if !errors.Is(st.err, context.DeadlineExceeded) {
		t.Fatalf("refresh error = %v, want deadline exceeded", st.err)
	}
	start := time.Now()
	h := p.Probe(time.Now())
	t.Logf("probe after a timed-out refresh took %v", time.Since(start)) // informative, not asserted
	wantGPUs(t, h.GPU, gpuIntel, stale(gpuNVSys), gpuAMD, gpuOther)
}

func TestGPUFailureKeepsLastGoodAnswer(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "broken")
	cmd := fakeCommand(t, `[ -e "`+marker+`" ] && exit 3`+"\n"+smi4090)
	p := newProber(t, WithRoot(newTree(t, gpuTreeFiles)), WithGPUCommand(cmd), WithGPURefresh(10*time.Millisecond))
	st := waitGPU(t, p, refreshed(1))
	if st.err != nil {
		t.Fatalf("refresh error: %v", st.err)
	}
	wantGPUs(t, p.Probe(st.at).GPU, gpuIntel, gpu4090, gpuAMD, gpuOther)

	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	st = waitGPU(t, p, func(st gpuState) bool { return st.err != nil })
	if !strings.Contains(st.err.Error(), "exit status 3") {
		t.Fatalf("refresh error = %v, want exit status 3", st.err)
	}
	wantGPUs(t, p.Probe(st.at).GPU, gpuIntel, stale(gpu4090), gpuAMD, gpuOther)

	// It recovers on the next good answer.
	if err := os.Remove(marker); err != nil {
		t.Fatal(err)
	}
	st = waitGPU(t, p, func(st gpuState) bool { return st.err == nil })
	wantGPUs(t, p.Probe(st.at).GPU, gpuIntel, gpu4090, gpuAMD, gpuOther)
}

func TestGPUFailureWithoutAnswerMarksSysfsStale(t *testing.T) {
	cmd := fakeCommand(t, "echo 'NVIDIA-SMI has failed' >&2; exit 1")
	p := newProber(t, WithRoot(newTree(t, gpuTreeFiles)), WithGPUCommand(cmd))
	st := waitGPU(t, p, refreshed(1))
	if st.err == nil {
		t.Fatal("refresh error = nil, want the command's failure")
	}
	wantGPUs(t, p.Probe(st.at).GPU, gpuIntel, stale(gpuNVSys), gpuAMD, gpuOther)
}

func TestGPUCommandNotInstalled(t *testing.T) {
	p := newProber(t, WithRoot(newTree(t, gpuTreeFiles)), WithGPUCommand(filepath.Join(t.TempDir(), "nvidia-smi")))
	st := waitGPU(t, p, refreshed(1))
	if st.err != nil {
		t.Fatalf("refresh error = %v, want nil (a missing tool is not a failure)", st.err)
	}
	wantGPUs(t, p.Probe(st.at).GPU, gpuIntel, gpuNVSys, gpuAMD, gpuOther)
}

func TestGPUCommandOnlyForNVIDIA(t *testing.T) {
	ran := filepath.Join(t.TempDir(), "ran")
	cmd := fakeCommand(t, `touch "`+ran+`"`+"\n"+smi4090)
	files := map[string]string{pci + "0000:03:00.0/class": "0x030000", pci + "0000:03:00.0/vendor": "0x1002"}
	p := newProber(t, WithRoot(newTree(t, files)), WithGPUCommand(cmd))
	st := waitGPU(t, p, refreshed(1))
	wantGPUs(t, p.Probe(st.at).GPU, caps.GPU{Vendor: "amd"})
	if _, err := os.Stat(ran); err == nil {
		t.Fatal("the GPU command ran on a machine without an NVIDIA device")
	}
}

func TestGPUWithoutPCIBusAsksTheDriver(t *testing.T) {
	cmd := fakeCommand(t, `printf 'NVIDIA H100 80GB HBM3, 81559\nNVIDIA H100 80GB HBM3, 81559\n'`)
	p := newProber(t, WithRoot(t.TempDir()), WithGPUCommand(cmd))
	st := waitGPU(t, p, refreshed(1))
	h100 := caps.GPU{Vendor: "nvidia", Model: "NVIDIA H100 80GB HBM3", VRAMMB: 81559}
	wantGPUs(t, p.Probe(st.at).GPU, h100, h100)
}

func TestGPUNoneBeforeFirstScan(t *testing.T) {
	p := &Prober{gpuRefresh: DefaultGPURefresh}
	if got := p.gpus(time.Now()); got != nil {
		t.Fatalf("gpus before the first scan = %+v, want none", got)
	}
}

func TestParseNVIDIASMI(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []caps.GPU
	}{
		{"one", "NVIDIA GeForce RTX 4090, 24564\n", []caps.GPU{gpu4090}},
		{"two, no final newline", "Tesla T4, 15360\nNVIDIA A10, 23028", []caps.GPU{
			{Vendor: "nvidia", Model: "Tesla T4", VRAMMB: 15360}, {Vendor: "nvidia", Model: "NVIDIA A10", VRAMMB: 23028}}},
		{"memory not available", "NVIDIA GH200, [N/A]\n", []caps.GPU{{Vendor: "nvidia", Model: "NVIDIA GH200"}}},
		{"comma in name", "Weird, Name, 1024\n", []caps.GPU{{Vendor: "nvidia", Model: "Weird, Name", VRAMMB: 1024}}},
		{"vram clamped", "Huge, 99999999999\n", []caps.GPU{{Vendor: "nvidia", Model: "Huge", VRAMMB: caps.MaxVRAMMB}}},
		{"negative vram", "Odd, -5\n", []caps.GPU{{Vendor: "nvidia", Model: "Odd"}}},
		{"crlf and blank lines", "\r\nA, 1\r\n\r\n", []caps.GPU{{Vendor: "nvidia", Model: "A", VRAMMB: 1}}},
		{"no comma", "No devices were found\n", nil},
		{"empty", "", nil},
		{"garbage", "\x00\xff,\xff\n,,,\n", []caps.GPU{{Vendor: "nvidia"}, {Vendor: "nvidia", Model: ",,"}}},
		{"capped", strings.Repeat("G, 1\n", caps.MaxGPUs+3), func() []caps.GPU {
			var out []caps.GPU
			for range caps.MaxGPUs {
				out = append(out, caps.GPU{Vendor: "nvidia", Model: "G", VRAMMB: 1})
			}
			return out
		}()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wantGPUs(t, parseNVIDIASMI([]byte(tc.in)), tc.want...)
		})
	}
}

func TestMergeNVIDIA(t *testing.T) {
	a100 := caps.GPU{Vendor: "nvidia", Model: "A100", VRAMMB: 40960}
	tests := []struct {
		name      string
		sys, rows []caps.GPU
		want      []caps.GPU
	}{
		{"replace in place", []caps.GPU{gpuIntel, gpuNVSys, gpuAMD}, []caps.GPU{a100}, []caps.GPU{gpuIntel, a100, gpuAMD}},
		{"device the driver does not see", []caps.GPU{gpuNVSys, gpuNVSys}, []caps.GPU{a100}, []caps.GPU{a100, gpuNVSys}},
		{"no pci", nil, []caps.GPU{a100, a100}, []caps.GPU{a100, a100}},
		{"no rows", []caps.GPU{gpuNVSys}, nil, []caps.GPU{gpuNVSys}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wantGPUs(t, mergeNVIDIA(tc.sys, tc.rows), tc.want...)
		})
	}
	many := make([]caps.GPU, caps.MaxGPUs)
	if got := mergeNVIDIA(many, many); len(got) != caps.MaxGPUs {
		t.Fatalf("merge of %d and %d rows gave %d, want %d", caps.MaxGPUs, caps.MaxGPUs, len(got), caps.MaxGPUs)
	}
}

func TestScanPCICapped(t *testing.T) {
	files := map[string]string{}
	for i := range caps.MaxGPUs + 4 {
		d := pci + "0000:" + string(rune('a'+i)) + "0:00.0/"
		files[d+"class"] = "0x030200"
		files[d+"vendor"] = "0x10DE"
		files[d+"mem_info_vram_total"] = "garbage"
	}
	gpus, ok := scanPCI(newTree(t, files))
	if !ok || len(gpus) != caps.MaxGPUs || gpus[0] != gpuNVSys {
		t.Fatalf("scanPCI = %d entries (ok %v), first %+v", len(gpus), ok, gpus[0])
	}
	if _, ok := scanPCI(t.TempDir()); ok {
		t.Fatal("scanPCI without a PCI bus reported ok")
	}
}

func FuzzParseNVIDIASMI(f *testing.F) {
	f.Add("NVIDIA GeForce RTX 4090, 24564\n")
	f.Add("a,b,c\n,\n")
	f.Fuzz(func(t *testing.T, in string) {
		gpus := parseNVIDIASMI([]byte(in))
		if len(gpus) > caps.MaxGPUs {
			t.Fatalf("%d gpus", len(gpus))
		}
		for _, g := range gpus {
			if g.Vendor != "nvidia" || len(g.Model) > caps.MaxString || g.VRAMMB < 0 || g.VRAMMB > caps.MaxVRAMMB {
				t.Fatalf("out of bounds: %+v", g)
			}
		}
	})
}

func TestRefreshRunsBeforeThePeriod(t *testing.T) {
	// With an hour-long period only the first refresh would ever run; Refresh brings the next.
	p := newProber(t, WithRoot(newTree(t, gpuTreeFiles)), WithGPUCommand(fakeCommand(t, "exit 1")),
		WithGPURefresh(time.Hour))
	waitGPU(t, p, refreshed(1))
	p.Refresh()
	p.Refresh() // folds into the pending one; never blocks
	waitGPU(t, p, refreshed(2))
}
