//go:build !linux

package synth

// hugeFloats returns n zeroed float32s for a model's weights (huge pages are asked for
// on Linux only: huge_linux.go).
func hugeFloats(n int) []float32 { return make([]float32, n) }
