package probe

import (
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

const cpuinfoX86 = `processor	: 0
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) Platinum 8480+
flags		: fpu vme sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_tile amx_bf16 amx_int8 avx_vnni
bogomips	: 4000.00

processor	: 1
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) Platinum 8480+
flags		: fpu vme sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_tile amx_bf16 amx_int8 avx_vnni
`

const cpuinfoARM64 = `processor	: 0
BogoMIPS	: 50.00
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp sve i8mm bf16 sve2
CPU implementer	: 0x41
CPU part	: 0xd4f

processor	: 1
BogoMIPS	: 50.00
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp sve i8mm bf16 sve2

processor	: 2
processor	: 3
Hardware	: BCM2835
`

const cpuinfoRPi32 = `processor	: 0
model name	: ARMv7 Processor rev 3 (v7l)
Features	: half thumb fastmult vfp edsp neon vfpv3 tls vfpv4 idiva idivt vfpd32 lpae evtstrm crc32

Hardware	: BCM2711
Model		: Raspberry Pi 4 Model B Rev 1.4
`

const cpuinfoBoard = `processor	: 0
Features	: half thumb neon
Hardware	: BCM2711
Model		: Raspberry Pi 4 Model B Rev 1.4
`

func TestParseCPUInfo(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		wantCores int
		wantModel string
		wantISA   []string
	}{
		{"x86", cpuinfoX86, 2, "Intel(R) Xeon(R) Platinum 8480+",
			[]string{"sse4_2", "avx", "f16c", "fma", "avx2", "avx_vnni", "avx512f", "avx512bw", "avx512vl",
				"avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}},
		{"arm64 features", cpuinfoARM64, 4, "BCM2835",
			[]string{"asimd", "asimdhp", "asimddp", "i8mm", "bf16", "sve", "sve2"}},
		{"arm32 model name wins", cpuinfoRPi32, 1, "ARMv7 Processor rev 3 (v7l)", []string{"neon"}},
		{"board Model before Hardware", cpuinfoBoard, 1, "Raspberry Pi 4 Model B Rev 1.4", []string{"neon"}},
		{"empty", "", 0, "", nil},
		{"no colon lines", "processor 0\nflags avx2\n", 0, "", nil},
		{"Processor capitalised is not a CPU", "Processor\t: ARMv7\nprocessor\t: 0\n", 1, "", nil},
		{"control characters cleaned", "model name\t: A\x01B\tC\xff  D\n", 0, "A B C D", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cores, model, isa := parseCPUInfo(strings.NewReader(tc.in))
			if cores != tc.wantCores || model != tc.wantModel || !slices.Equal(isa, tc.wantISA) {
				t.Fatalf("parseCPUInfo = %d, %q, %q; want %d, %q, %q",
					cores, model, isa, tc.wantCores, tc.wantModel, tc.wantISA)
			}
		})
	}
}

func TestParseCPUInfoLongLine(t *testing.T) {
	// A line beyond maxLineBytes ends the scan; what came before is kept.
	in := "processor\t: 0\nflags\t: " + strings.Repeat("x", maxLineBytes+10) + "\nprocessor\t: 1\n"
	cores, _, isa := parseCPUInfo(strings.NewReader(in))
	if cores != 1 || isa != nil {
		t.Fatalf("parseCPUInfo = %d cores, isa %q; want 1, none", cores, isa)
	}
}

func TestFilterISACap(t *testing.T) {
	isa := filterISA(notableISA + " " + notableISA)
	if len(isa) > caps.MaxISA || len(isa) != len(strings.Fields(notableISA)) {
		t.Fatalf("filterISA returned %d entries", len(isa))
	}
}

func TestReadCPU(t *testing.T) {
	root := newTree(t, map[string]string{"proc/cpuinfo": cpuinfoX86})
	c := readCPU(root)
	if c.Cores != 2 || c.Arch != runtime.GOARCH || c.Model != "Intel(R) Xeon(R) Platinum 8480+" || len(c.ISAExt) != 14 {
		t.Fatalf("readCPU = %+v", c)
	}

	// Absent file, or one without processor lines: the runtime's count.
	for name, files := range map[string]map[string]string{
		"absent":  nil,
		"garbage": {"proc/cpuinfo": "\x00\x01garbage:::\n"},
	} {
		c := readCPU(newTree(t, files))
		if c.Cores != runtime.NumCPU() || c.Arch != runtime.GOARCH {
			t.Fatalf("%s: readCPU = %+v, want %d cores", name, c, runtime.NumCPU())
		}
	}

	// More processors than caps allows are capped.
	c = readCPU(newTree(t, map[string]string{"proc/cpuinfo": strings.Repeat("processor\t: 0\n", caps.MaxCores+5)}))
	if c.Cores != caps.MaxCores {
		t.Fatalf("cores = %d, want %d", c.Cores, caps.MaxCores)
	}
}

func TestCleanText(t *testing.T) {
	tests := []struct{ in, want string }{
		{"  plain  ", "plain"},
		{"a\tb\nc", "a b c"},
		{"bad\xffutf8\u007f", "badutf8"},
		{"\ufffdx", "x"},
		{strings.Repeat("é", 100), strings.Repeat("é", caps.MaxString/2)},
		{strings.Repeat("a ", 100), strings.TrimSpace(strings.Repeat("a ", caps.MaxString/2))},
	}
	for _, tc := range tests {
		got := cleanText(tc.in)
		if got != tc.want || len(got) > caps.MaxString {
			t.Fatalf("cleanText(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func FuzzParseCPUInfo(f *testing.F) {
	for _, s := range []string{cpuinfoX86, cpuinfoARM64, cpuinfoRPi32, "", ":", "processor:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		cores, model, isa := parseCPUInfo(strings.NewReader(in))
		if cores < 0 || len(model) > caps.MaxString || len(isa) > caps.MaxISA {
			t.Fatalf("out of bounds: %d %q %q", cores, model, isa)
		}
	})
}
