package synth

import (
	"syscall"
	"unsafe"
)

// hugeFloats returns n zeroed float32s for a model's weights, asking Linux to back them
// with huge pages (madvise MADV_HUGEPAGE; the kernel may not, and then nothing changes).
//
// Why: a decode step reads every page of the weights, and with 4 KiB pages each page's
// first read after other work ran (another model's steps, a long prefill) costs a page
// walk the CPU no longer has cached, under a hypervisor a slow one. A replacement that
// takes over a generation has just that: weights idle while its peer worked, and its first
// step at the switch took 3 to 3.4 times its steady step on a 2-core VM (BenchmarkM1,
// "b-first-step"); with huge pages 1.15 to 1.23, while a step on a warm machine costs
// within 3 % of what it did (BenchmarkDecodeStepByContext). The KV cache stays on
// ordinary pages: on huge pages a step at a short context measured a fifth slower.
func hugeFloats(n int) []float32 {
	f := make([]float32, n)
	if n*4 >= 4<<20 { // below a couple of huge pages there is nothing to gain
		syscall.Madvise(unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), n*4), syscall.MADV_HUGEPAGE)
	}
	return f
}
