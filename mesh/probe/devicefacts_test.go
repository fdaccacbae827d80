package probe

import (
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// deviceTree is a machine with two Xeon cores, 15.3 GiB of memory as the kernel reports it,
// and gpuTreeFiles' GPUs.
func deviceTree(t *testing.T) map[string]string {
	t.Helper()
	files := maps.Clone(gpuTreeFiles)
	files["proc/cpuinfo"] = cpuinfoX86
	files["proc/meminfo"] = "MemTotal:       16041984 kB\nMemFree:  1000 kB\nMemAvailable:   8000000 kB\n"
	return files
}

// ReadDeviceFacts reads the CPU, the memory rounded up and every GPU of the PCI bus, and
// runs no command: not even an nvidia-smi first on PATH, with an NVIDIA card present.
func TestReadDeviceFacts(t *testing.T) {
	ran := filepath.Join(t.TempDir(), "ran")
	smi := fakeCommand(t, `touch "`+ran+`"`+"\n"+smi4090)
	t.Setenv("PATH", filepath.Dir(smi)+string(os.PathListSeparator)+os.Getenv("PATH"))
	root := newTree(t, deviceTree(t))

	got := ReadDeviceFacts(root)
	want := DeviceFacts{CPUModel: "Intel(R) Xeon(R) Platinum 8480+", Cores: 2, RAMGiB: 16,
		GPUs: []string{"intel", "nvidia", "amd AMD Radeon RX 7800 XT", "other"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadDeviceFacts = %+v\nwant %+v", got, want)
	}
	if again := ReadDeviceFacts(root); !reflect.DeepEqual(again, got) {
		t.Fatalf("a second read gave %+v, the first %+v", again, got)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Fatal("ReadDeviceFacts ran nvidia-smi")
	}
	// Control: the fake nvidia-smi is found and runs when invoked by name.
	p := newProber(t, WithRoot(root))
	waitGPU(t, p, func(s gpuState) bool { return s.refreshes > 0 })
	if _, err := os.Stat(ran); err != nil {
		t.Fatalf("control: the Prober did not run the nvidia-smi on PATH: %v", err)
	}

	// Nothing to read: the documented zero values, and the runtime's core count.
	if empty := ReadDeviceFacts(t.TempDir()); empty.CPUModel != "" || empty.RAMGiB != 0 || empty.GPUs != nil || empty.Cores < 1 {
		t.Fatalf("ReadDeviceFacts of an empty root = %+v", empty)
	}
}

// The same GPUs in other PCI slots (so listed in another order) are the same facts.
func TestDeviceFactsIgnoreGPUOrder(t *testing.T) {
	files := deviceTree(t)
	moved := map[string]string{}
	for p, c := range files {
		// The AMD card moves before the others: 0000:03:00.0 becomes 0000:00:01.0.
		moved[strings.Replace(p, "0000:03:00.0", "0000:00:01.0", 1)] = c
	}
	a, b := ReadDeviceFacts(newTree(t, files)), ReadDeviceFacts(newTree(t, moved))
	if reflect.DeepEqual(a.GPUs, b.GPUs) {
		t.Fatalf("control: the moved card is listed in the same order: %v", a.GPUs)
	}
	if !bytes.Equal(a.Canonical(), b.Canonical()) {
		t.Fatalf("canonical facts differ with the GPUs' order:\n%s\n%s", a.Canonical(), b.Canonical())
	}
}

// Canonical is one encoding per set of facts: the GPUs' order and nil against empty do not
// matter, every fact does.
func TestDeviceFactsCanonical(t *testing.T) {
	base := DeviceFacts{CPUModel: "cpu", Cores: 8, RAMGiB: 16, GPUs: []string{"nvidia", "amd X"}}
	if f := (DeviceFacts{CPUModel: "cpu", Cores: 8, RAMGiB: 16, GPUs: []string{"amd X", "nvidia"}}); !bytes.Equal(f.Canonical(), base.Canonical()) {
		t.Errorf("%+v encodes as %s, %+v as %s", f, f.Canonical(), base, base.Canonical())
	}
	if a, b := (DeviceFacts{Cores: 1}).Canonical(), (DeviceFacts{Cores: 1, GPUs: []string{}}).Canonical(); !bytes.Equal(a, b) {
		t.Errorf("no GPU encodes as %s and as %s", a, b)
	}
	for _, f := range []DeviceFacts{
		{CPUModel: "cpu2", Cores: 8, RAMGiB: 16, GPUs: base.GPUs},
		{CPUModel: "cpu", Cores: 9, RAMGiB: 16, GPUs: base.GPUs},
		{CPUModel: "cpu", Cores: 8, RAMGiB: 32, GPUs: base.GPUs},
		{CPUModel: "cpu", Cores: 8, RAMGiB: 16, GPUs: []string{"nvidia"}},
		{CPUModel: "cpu", Cores: 8, RAMGiB: 16, GPUs: []string{"nvidia", "amd X", "amd X"}},
		{CPUModel: "cpu", Cores: 8, RAMGiB: 16, GPUs: []string{"nvidia,amd X"}},
	} {
		if bytes.Equal(f.Canonical(), base.Canonical()) {
			t.Errorf("%+v encodes as %+v does: %s", f, base, f.Canonical())
		}
	}
	// The input is left as it was.
	if base.GPUs[0] != "nvidia" {
		t.Errorf("Canonical sorted its receiver's GPUs: %v", base.GPUs)
	}
}

// Memory rounds up to a power of two GiB: what the kernel reports of a 16 GiB machine, a
// little under 16 GiB and changing with the kernel, is 16.
func TestRoundGiB(t *testing.T) {
	for _, tc := range []struct{ mb, want int64 }{
		{0, 0}, {-1, 0}, {1, 1}, {1024, 1}, {1025, 2}, {7800, 8}, {15400, 16}, {15900, 16}, {16384, 16}, {16385, 32}, {24000, 32},
	} {
		if got := roundGiB(tc.mb); got != tc.want {
			t.Errorf("roundGiB(%d) = %d, want %d", tc.mb, got, tc.want)
		}
	}
}
