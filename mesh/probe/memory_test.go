package probe

import (
	"testing"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

const meminfo = `MemTotal:       16318888 kB
MemFree:          512000 kB
MemAvailable:    8159444 kB
Buffers:          102400 kB
HugePages_Total:       0
`

func TestParseMeminfo(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want caps.RAM
	}{
		{"available", meminfo, caps.RAM{TotalMB: 15936, FreeMB: 7968}},
		{"old kernel uses MemFree", "MemTotal: 2097152 kB\nMemFree: 1048576 kB\n", caps.RAM{TotalMB: 2048, FreeMB: 1024}},
		{"free above total is clamped", "MemTotal: 1024 kB\nMemAvailable: 4096 kB\n", caps.RAM{TotalMB: 1, FreeMB: 1}},
		{"above the caps bound", "MemTotal: 999999999999999 kB\nMemAvailable: 1 kB\n", caps.RAM{TotalMB: caps.MaxRAMMB}},
		{"overflow", "MemTotal: 99999999999999999999999 kB\n", caps.RAM{}},
		{"negative", "MemTotal: -5 kB\nMemAvailable: -1 kB\n", caps.RAM{}},
		{"no value", "MemTotal:\nMemAvailable:", caps.RAM{}},
		{"truncated", "MemTotal:       163", caps.RAM{}},
		{"empty", "", caps.RAM{}},
		{"garbage", "\x00\xff:::\n::\n", caps.RAM{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseMeminfo([]byte(tc.in)); got != tc.want {
				t.Fatalf("parseMeminfo = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestReadMemory(t *testing.T) {
	if got, want := readMemory(newTree(t, map[string]string{"proc/meminfo": meminfo})), (caps.RAM{TotalMB: 15936, FreeMB: 7968}); got != want {
		t.Fatalf("readMemory = %+v, want %+v", got, want)
	}
	if got := readMemory(t.TempDir()); got != (caps.RAM{}) {
		t.Fatalf("readMemory without meminfo = %+v, want zero", got)
	}
}

func FuzzParseMeminfo(f *testing.F) {
	f.Add(meminfo)
	f.Add("MemTotal: 1 kB\n")
	f.Fuzz(func(t *testing.T, in string) {
		r := parseMeminfo([]byte(in))
		if r.TotalMB < 0 || r.TotalMB > caps.MaxRAMMB || r.FreeMB < 0 || r.FreeMB > r.TotalMB {
			t.Fatalf("out of bounds: %+v", r)
		}
	})
}
