package synth

import (
	"slices"
	"strings"

	"github.com/meshinfer/meshinfer/inference"
)

// Preset is the shape of one synthetic model. Its weights are a function of Name alone, so
// two presets with the same shape and different names are different models.
type Preset struct {
	Name    string
	Dim     int // width of the residual stream (d_model)
	Layers  int // transformer blocks
	Heads   int // attention heads; Dim/Heads is the head width
	FFN     int // hidden width of the MLP
	Vocab   int // vocabulary size, special tokens included
	Context int // context window, in tokens (prompt and completion together)
}

// Params is the number of parameters (float32 values) of the model: the head's
// (HeadParams) and Layers times one layer's (LayerParams).
func (p Preset) Params() int { return p.HeadParams() + p.Layers*p.LayerParams() }

// LayerParams is the number of parameters of one layer: 2·Dim (norm gains), 4·Dim² (q, k,
// v, o) and 2·Dim·FFN (MLP).
func (p Preset) LayerParams() int { return 2*p.Dim + 4*p.Dim*p.Dim + 2*p.Dim*p.FFN }

// HeadParams is the number of parameters outside the layers, which the head of a sharded
// generation holds: token embedding Vocab×Dim, positions Context×Dim, final norm Dim, and
// output projection Vocab×Dim (not tied to the embedding).
func (p Preset) HeadParams() int { return 2*p.Vocab*p.Dim + p.Context*p.Dim + p.Dim }

// Shape is p as placement sees it. Every parameter is a float32 once loaded: 4 bytes.
func (p Preset) Shape() inference.ModelShape {
	return inference.ModelShape{
		Layers:          p.Layers,
		Width:           p.Dim,
		Params:          int64(p.Params()),
		WeightBytes:     4 * int64(p.Params()),
		LayerBytes:      4 * int64(p.LayerParams()),
		HeadBytes:       4 * int64(p.HeadParams()),
		KVBytesPerToken: 2 * int64(p.Layers) * int64(p.Dim) * 4,
		Context:         p.Context,
	}
}

// presets is the documented table (see the package doc). Returned by value from a function
// so that there is no mutable package state.
func presets() []Preset {
	return []Preset{
		{Name: "synth-tiny", Dim: 64, Layers: 2, Heads: 4, FFN: 256, Vocab: 512, Context: 512},
		{Name: "synth-small", Dim: 256, Layers: 4, Heads: 8, FFN: 1024, Vocab: 2048, Context: 4096},
		{Name: "synth-base", Dim: 512, Layers: 8, Heads: 8, FFN: 2048, Vocab: 4096, Context: 4096},
		{Name: "synth-large", Dim: 768, Layers: 16, Heads: 12, FFN: 3072, Vocab: 4096, Context: 1024},
	}
}

// Presets returns the preset table, smallest first. The slice is fresh.
func Presets() []Preset { return presets() }

// LookupPreset returns the preset with the given name.
func LookupPreset(name string) (Preset, bool) {
	i := slices.IndexFunc(presets(), func(p Preset) bool { return p.Name == name })
	if i < 0 {
		return Preset{}, false
	}
	return presets()[i], true
}

// presetNames lists the known names, comma-separated, for error messages.
func presetNames() string {
	var names []string
	for _, p := range presets() {
		names = append(names, p.Name)
	}
	return strings.Join(names, ", ")
}
