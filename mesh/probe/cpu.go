package probe

import (
	"bufio"
	"io"
	"os"
	"runtime"
	"strings"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

// notableISA lists the instruction-set extensions worth announcing, in the order they are
// reported, with the kernel's spelling. They are the ones inference kernels (llama.cpp, ONNX
// Runtime, oneDNN, KleidiAI) dispatch on; the rest of the flags line says nothing a scheduler
// can use and would only grow the vector.
//
//   - x86: sse4_2 (baseline of x86-64-v2), avx, f16c, fma, avx2 (x86-64-v3), avx_vnni, avx512f,
//     avx512bw, avx512vl (x86-64-v4), avx512_vnni, avx512_bf16, avx512_fp16, amx_tile,
//     amx_bf16, amx_int8 (Sapphire Rapids matrix units).
//   - ARM: neon (32-bit), asimd (64-bit NEON), asimdhp (fp16 arithmetic), asimddp (dot
//     product), asimdfhm, i8mm (int8 matrix multiply), bf16, sve, sve2, sme.
const notableISA = "sse4_2 avx f16c fma avx2 avx_vnni avx512f avx512bw avx512vl avx512_vnni " +
	"avx512_bf16 avx512_fp16 amx_tile amx_bf16 amx_int8 " +
	"neon asimd asimdhp asimddp asimdfhm i8mm bf16 sve sve2 sme"

// readCPU reads the static CPU description under root. It is called once per Prober.
func readCPU(root string) caps.CPU {
	c := caps.CPU{Arch: runtime.GOARCH}
	f, err := os.Open(under(root, "/proc/cpuinfo"))
	if err == nil {
		c.Cores, c.Model, c.ISAExt = parseCPUInfo(io.LimitReader(f, maxCPUInfoBytes))
		f.Close()
	}
	// A missing file, or one without a single "processor" line, says nothing about the core
	// count; the runtime's view (the process's affinity mask) is the best fallback.
	if c.Cores < 1 {
		c.Cores = runtime.NumCPU()
	}
	c.Cores = min(c.Cores, caps.MaxCores)
	return c
}

// parseCPUInfo extracts the processor count, the model and the notable ISA extensions from
// /proc/cpuinfo content. It reads until EOF, an over-long line or a read error, and keeps what it
// found until then.
func parseCPUInfo(r io.Reader) (cores int, model string, isa []string) {
	var modelName, boardModel, hardware, flags string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLineBytes)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		switch key {
		case "processor":
			cores++
		case "model name":
			if modelName == "" {
				modelName = val
			}
		case "Model":
			if boardModel == "" {
				boardModel = val
			}
		case "Hardware":
			if hardware == "" {
				hardware = val
			}
		case "flags", "Features":
			if flags == "" {
				flags = val
			}
		}
	}
	for _, m := range []string{modelName, boardModel, hardware} {
		if model = cleanText(m); model != "" {
			break
		}
	}
	return cores, model, filterISA(flags)
}

// filterISA returns the notable extensions present in a space-separated flags line, in the
// order of notableISA, at most caps.MaxISA of them.
func filterISA(flags string) []string {
	have := make(map[string]bool)
	for _, f := range strings.Fields(flags) {
		have[f] = true
	}
	var isa []string
	for _, f := range strings.Fields(notableISA) {
		if have[f] && len(isa) < caps.MaxISA {
			isa = append(isa, f)
		}
	}
	return isa
}
