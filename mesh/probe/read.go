package probe

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

// Read limits.
const (
	// maxFileBytes bounds every procfs and sysfs read, in bytes. A sysfs attribute is at most one
	// page (4 KiB) and /proc/meminfo about 1.5 KiB; 64 KiB only stops a garbage file from costing
	// memory.
	maxFileBytes = 64 << 10
	// maxCPUInfoBytes bounds the /proc/cpuinfo scan, in bytes. It holds about 1.5 KiB per logical
	// CPU on x86, so caps.MaxCores (4096) CPUs need about 6 MiB. It is read once and streamed.
	maxCPUInfoBytes = 8 << 20
	// maxLineBytes is the longest /proc/cpuinfo line scanned, in bytes. The x86 "flags" line is
	// about 1.5 KiB today; a longer line ends the scan with what was read so far.
	maxLineBytes = 64 << 10
)

// under returns the path p (written absolute, as on a real system) inside root.
func under(root, p string) string {
	return filepath.Join(root, p)
}

// readFile reads at most maxFileBytes of the file at path.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxFileBytes))
}

// readString returns the file's content with surrounding space trimmed; ok is false when the file
// cannot be read.
func readString(path string) (s string, ok bool) {
	b, err := readFile(path)
	if err != nil {
		return "", false
	}
	return strings.TrimSpace(string(b)), true
}

// readInt returns the file's content parsed as a decimal integer; ok is false when the file cannot
// be read or does not hold one.
func readInt(path string) (n int64, ok bool) {
	s, ok := readString(path)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, false
	}
	return n, true
}

// cleanText makes s acceptable as a caps free-text field: invalid UTF-8, U+FFFD and control
// characters are dropped, runs of space are collapsed, and the result is cut to caps.MaxString
// bytes on a rune boundary.
func cleanText(s string) string {
	var b strings.Builder
	space := false
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		switch {
		case r == utf8.RuneError, r == 0x7f:
			continue
		case unicode.IsSpace(r) || r < 0x20:
			space = b.Len() > 0
			continue
		}
		n := utf8.RuneLen(r)
		if space {
			n++
		}
		if b.Len()+n > caps.MaxString {
			break
		}
		if space {
			b.WriteByte(' ')
			space = false
		}
		b.WriteRune(r)
	}
	return b.String()
}
