package caps

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Bounds on announced values. A vector outside them is rejected as impossible: they are wide
// enough for any real machine and tight enough that a liar cannot claim a datacentre.
const (
	// MaxEncodedSize is the largest announcement accepted, in bytes. A full vector with 64
	// models of 128-byte names, each with its size, is about 16 KiB; 24 KiB leaves room
	// without letting one message cost much.
	MaxEncodedSize = 24 << 10
	// MaxLayers is the most layers a model may claim.
	MaxLayers = 1024
	// MaxModelBytes is the largest model a node may announce, in bytes (64 TiB: the RAM bound).
	MaxModelBytes = int64(MaxRAMMB) << 20
	// MaxCores is the most logical cores a node may claim (the largest 2-socket servers have 512).
	MaxCores = 4096
	// MaxRAMMB is the most RAM a node may claim, in MiB (64 TiB).
	MaxRAMMB = 64 << 20
	// MaxGPUs is the most accelerators one node may list in gpus.
	MaxGPUs = 16
	// MaxVRAMMB is the most memory one accelerator may claim, in MiB (1 TiB).
	MaxVRAMMB = 1 << 20
	// MaxModels is the most models one node may announce.
	MaxModels = 64
	// MaxStages is the most layer ranges one node may announce in stages. A node of
	// synthetic models (names of at most 11 bytes) lists 64 in under 4 KiB; 64 of 128-byte
	// names take about 11 KiB, so a vector with both models and stages at their bounds can
	// exceed MaxEncodedSize: a node that holds that much must list fewer.
	MaxStages = 64
	// MaxISA is the most ISA extensions listed.
	MaxISA = 64
	// MaxString is the longest free-text field (model names, CPU model, vendors), in bytes.
	MaxString = 128
	// MaxRTTMS caps the announced RTT, in milliseconds (a minute means "unreachable").
	MaxRTTMS = 60_000
	// MaxDownlinkMbps caps the announced downlink (1 Tbit/s).
	MaxDownlinkMbps = 1_000_000
	// MaxLoad caps in-flight and queued task counts.
	MaxLoad = 1 << 20
	// MaxTTL is the longest validity a signer may give a vector. Vectors are re-issued every
	// heartbeat (15 s), so anything longer only widens the replay window.
	MaxTTL = 10 * time.Minute
	// MaxClockSkew is how far the signer's clock may be from the receiver's, either way
	// (docs/reliability.md F5): issued_at may lie this far ahead, and expires_at this far behind.
	MaxClockSkew = 5 * time.Minute
)

// ErrOutOfBounds marks a vector whose values are impossible or malformed.
var ErrOutOfBounds = errors.New("capability value out of bounds")

// Validate checks every field against the documented bounds. It does not check the signature
// or the time window (see Verify).
func (v *Vector) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrOutOfBounds, fmt.Sprintf(format, args...))
	}
	if v.PeerID == "" {
		return bad("peer_id missing")
	}
	switch v.Runtime {
	case RuntimeBrowser, RuntimeDesktop, RuntimeIOS, RuntimeAndroid:
	default:
		return bad("runtime %q unknown", v.Runtime)
	}
	if v.CPU.Cores < 1 || v.CPU.Cores > MaxCores {
		return bad("cpu.cores %d not in [1, %d]", v.CPU.Cores, MaxCores)
	}
	if !shortText(v.CPU.Arch) || v.CPU.Arch == "" || !shortText(v.CPU.Model) {
		return bad("cpu arch or model malformed")
	}
	if len(v.CPU.ISAExt) > MaxISA {
		return bad("cpu.isa_ext has %d entries, max %d", len(v.CPU.ISAExt), MaxISA)
	}
	for _, s := range v.CPU.ISAExt {
		if s == "" || !shortText(s) {
			return bad("cpu.isa_ext entry malformed")
		}
	}
	if v.GPU != nil {
		if err := v.GPU.validate(); err != "" {
			return bad("gpu.%s", err)
		}
	}
	if len(v.GPUs) > MaxGPUs {
		return bad("gpus has %d entries, max %d", len(v.GPUs), MaxGPUs)
	}
	for _, g := range v.GPUs {
		if err := g.validate(); err != "" {
			return bad("gpus[].%s", err)
		}
	}
	if len(v.GPUs) > 0 && (v.GPU == nil || !slices.Contains(v.GPUs, *v.GPU)) {
		return bad("gpu is not one of gpus")
	}
	if !shortText(v.NPU.Vendor) || !v.NPU.Present && v.NPU.Vendor != "" {
		return bad("npu.vendor %q malformed or without an npu", v.NPU.Vendor)
	}
	if v.RAM.TotalMB < 1 || v.RAM.TotalMB > MaxRAMMB || v.RAM.FreeMB < 0 || v.RAM.FreeMB > v.RAM.TotalMB ||
		v.RAM.BudgetMB < 0 || v.RAM.BudgetMB > v.RAM.TotalMB {
		return bad("ram total %d free %d budget %d inconsistent", v.RAM.TotalMB, v.RAM.FreeMB, v.RAM.BudgetMB)
	}
	b := v.Battery
	if !finiteIn(b.Level, 0, 1) || !finiteIn(b.Floor, 0, 1) {
		return bad("battery level %v floor %v not fractions in [0, 1]", b.Level, b.Floor)
	}
	if !b.Present && (b.Level != 0 || b.Charging) {
		return bad("battery level %v charging %v without a battery", b.Level, b.Charging)
	}
	switch v.Thermal {
	case ThermalNominal, ThermalFair, ThermalSerious, ThermalCritical:
	default:
		return bad("thermal %q unknown", v.Thermal)
	}
	switch v.AppState {
	case AppStateForeground, AppStateBackgroundTask, AppStateBackground:
	default:
		return bad("app_state %q unknown", v.AppState)
	}
	if v.Runtime == RuntimeDesktop && v.AppState != AppStateForeground {
		return bad("app_state %q on a desktop, which is always %q", v.AppState, AppStateForeground)
	}
	switch v.Net.Type {
	case NetBluetooth, NetCellular, NetEthernet, NetMixed, NetNone, NetOther, NetUnknown, NetWiFi, NetWiMAX:
	default:
		return bad("net.type %q unknown", v.Net.Type)
	}
	if !finiteIn(v.Net.RTTMS, 0, MaxRTTMS) || !finiteIn(v.Net.DownlinkMbps, 0, MaxDownlinkMbps) {
		return bad("net rtt_ms %v downlink_mbps %v out of range", v.Net.RTTMS, v.Net.DownlinkMbps)
	}
	if len(v.Models) > MaxModels {
		return bad("models has %d entries, max %d", len(v.Models), MaxModels)
	}
	seen := make(map[string]bool, len(v.Models))
	for _, m := range v.Models {
		if m.Name == "" || !shortText(m.Name) || seen[m.Name] {
			return bad("model name %q empty, too long or repeated", m.Name)
		}
		seen[m.Name] = true
		if m.State != ModelWarm && m.State != ModelCold {
			return bad("model %q state %q unknown", m.Name, m.State)
		}
		if m.Layers < 0 || m.Layers > MaxLayers || m.WeightBytes < 0 || m.WeightBytes > MaxModelBytes ||
			m.KVBytesPerToken < 0 || m.KVBytesPerToken > m.WeightBytes || (m.Layers == 0) != (m.WeightBytes == 0) {
			return bad("model %q size (layers %d, weight_bytes %d, kv_bytes_per_token %d) out of range",
				m.Name, m.Layers, m.WeightBytes, m.KVBytesPerToken)
		}
	}
	if err := validateStages(v.Stages, v.Models); err != "" {
		return bad("%s", err)
	}
	if v.Load.InFlight < 0 || v.Load.InFlight > MaxLoad || v.Load.Queue < 0 || v.Load.Queue > MaxLoad ||
		v.Load.Capacity < 0 || v.Load.Capacity > MaxLoad {
		return bad("load in_flight %d capacity %d queue %d out of range", v.Load.InFlight, v.Load.Capacity, v.Load.Queue)
	}
	if v.Seq == 0 {
		return bad("seq must be positive")
	}
	ttl := v.Expires - v.IssuedAt
	if v.IssuedAt <= 0 || ttl <= 0 || ttl > MaxTTL.Milliseconds() {
		return bad("validity window %d ms not in (0, %d]", ttl, MaxTTL.Milliseconds())
	}
	return nil
}

// validateStages checks the stages list against its bounds and the models announced beside
// it, and says what is wrong, or "".
func validateStages(stages []Stage, models []Model) string {
	if len(stages) > MaxStages {
		return fmt.Sprintf("stages has %d entries, max %d", len(stages), MaxStages)
	}
	type key struct {
		model  string
		lo, hi int
	}
	seen := make(map[key]bool, len(stages))
	for _, st := range stages {
		i := slices.IndexFunc(models, func(m Model) bool { return m.Name == st.Model })
		if i < 0 {
			return fmt.Sprintf("stage of model %.128q, which is not in models", st.Model)
		}
		if st.Lo < 0 || st.Lo >= st.Hi || st.Hi > MaxLayers || models[i].Layers > 0 && st.Hi > models[i].Layers {
			return fmt.Sprintf("stage of %q: layers [%d, %d) are not a range of its %d layers (max %d)",
				st.Model, st.Lo, st.Hi, models[i].Layers, MaxLayers)
		}
		if st.State != StageLoading && st.State != StageWarm {
			return fmt.Sprintf("stage of %q [%d, %d): state %q unknown", st.Model, st.Lo, st.Hi, st.State)
		}
		k := key{st.Model, st.Lo, st.Hi}
		if seen[k] {
			return fmt.Sprintf("stage of %q [%d, %d) listed twice", st.Model, st.Lo, st.Hi)
		}
		seen[k] = true
	}
	return ""
}

// validate checks one GPU entry and says what is wrong, or "".
func (g *GPU) validate() string {
	if g.Vendor == "" || !shortText(g.Vendor) || !shortText(g.Model) {
		return "vendor or model malformed"
	}
	if g.VRAMMB < 0 || g.VRAMMB > MaxVRAMMB {
		return fmt.Sprintf("vram_mb %d not in [0, %d]", g.VRAMMB, MaxVRAMMB)
	}
	return ""
}

// Model states.
const (
	ModelWarm = "warm"
	ModelCold = "cold"
)

// Stage states: a layer range held for pipelines is loading, then warm.
const (
	StageLoading = "loading"
	StageWarm    = "warm"
)

func shortText(s string) bool {
	if len(s) > MaxString {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r == 0xfffd {
			return false
		}
	}
	return true
}

func finiteIn(x, lo, hi float64) bool {
	return !math.IsNaN(x) && !math.IsInf(x, 0) && x >= lo && x <= hi
}
