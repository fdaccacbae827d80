package probe

import (
	"bytes"
	"strconv"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

// readMemory reads system memory under root. A missing /proc/meminfo gives zero values.
func readMemory(root string) caps.RAM {
	b, err := readFile(under(root, "/proc/meminfo"))
	if err != nil {
		return caps.RAM{}
	}
	return parseMeminfo(b)
}

// parseMeminfo reads MemTotal and MemAvailable (MemFree when the kernel predates MemAvailable,
// Linux 3.14) from /proc/meminfo content. Values are in kB (KiB) and converted to MiB, clamped to
// [0, caps.MaxRAMMB], and free never exceeds total.
func parseMeminfo(b []byte) caps.RAM {
	var total, avail, free int64 = -1, -1, -1
	for line := range bytes.Lines(b) {
		key, rest, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		var dst *int64
		switch string(key) {
		case "MemTotal":
			dst = &total
		case "MemAvailable":
			dst = &avail
		case "MemFree":
			dst = &free
		default:
			continue
		}
		fields := bytes.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		if kb, err := strconv.ParseInt(string(fields[0]), 10, 64); err == nil && kb >= 0 {
			*dst = kb
		}
	}
	if avail < 0 {
		avail = free
	}
	ram := caps.RAM{TotalMB: clampMB(total), FreeMB: clampMB(avail)}
	ram.FreeMB = min(ram.FreeMB, ram.TotalMB)
	return ram
}

// clampMB converts kB to MiB within [0, caps.MaxRAMMB]; negative means unknown and gives 0.
func clampMB(kb int64) int64 {
	if kb < 0 {
		return 0
	}
	return min(kb>>10, caps.MaxRAMMB)
}
