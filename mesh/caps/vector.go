package caps

import "slices"

// Vector is a node's capability vector as announced on the mesh. Field order is part of the
// signed encoding: append new fields at the end of a struct and bump Domain when changing it.
type Vector struct {
	PeerID   string  `json:"peer_id"`
	Runtime  string  `json:"runtime"`
	CPU      CPU     `json:"cpu"`
	GPU      []GPU   `json:"gpu"`
	NPU      NPU     `json:"npu"`
	RAM      RAM     `json:"ram"`
	Battery  Battery `json:"battery"`
	Thermal  string  `json:"thermal"`
	AppState string  `json:"app_state"`
	Net      Net     `json:"net"`
	Models   []Model `json:"models"`
	Load     Load    `json:"load"`
	Seq      uint64  `json:"seq"`
	IssuedAt int64   `json:"issued_at"`  // unix milliseconds, signer's clock
	Expires  int64   `json:"expires_at"` // unix milliseconds, signer's clock
	Sig      string  `json:"sig,omitempty"`
}

// CPU describes the processor.
type CPU struct {
	Cores int      `json:"cores"`           // logical cores online
	Arch  string   `json:"arch"`            // GOARCH-style name: amd64, arm64, ...
	Model string   `json:"model,omitempty"` // model name as the kernel reports it
	ISA   []string `json:"isa,omitempty"`   // notable extensions: avx2, avx512f, neon, ...
}

// GPU describes one accelerator as the system exposes it.
type GPU struct {
	Vendor string `json:"vendor"`            // nvidia, amd, intel, apple, other
	Model  string `json:"model,omitempty"`   // marketing or PCI name when known
	VRAMMB int64  `json:"vram_mb,omitempty"` // dedicated memory in MiB; 0 when unknown
	Stale  bool   `json:"stale,omitempty"`   // data comes from a cache older than its refresh period
}

// NPU tells whether a neural accelerator is present.
type NPU struct {
	Present bool   `json:"present"`
	Model   string `json:"model,omitempty"`
}

// RAM is system memory in MiB.
type RAM struct {
	TotalMB int64 `json:"total_mb"`
	FreeMB  int64 `json:"free_mb"` // MemAvailable, not MemFree: what a new task could use
}

// Battery is the power source state. Level is a percentage, meaningful only when Present.
type Battery struct {
	Present  bool `json:"present"`
	Level    int  `json:"level"`
	Charging bool `json:"charging"`
}

// Net is the node's view of its network.
type Net struct {
	RTTMS        float64 `json:"rtt_ms"`        // median libp2p ping RTT to connected peers; 0 when none
	DownlinkMbps float64 `json:"downlink_mbps"` // estimate; 0 when unknown
	Effective    string  `json:"effective"`     // slow-2g, 2g, 3g, 4g: the browsers' classification
	Metered      bool    `json:"metered"`
}

// Model is one model this node serves.
type Model struct {
	Name  string `json:"name"`
	State string `json:"state"` // warm or cold
	// Deterministic: the same request always gives the same tokens (the synthetic
	// presets), so a stream cut on another node can be resumed here.
	Deterministic bool `json:"deterministic,omitempty"`
}

// Load is the node's current work.
type Load struct {
	InFlight int `json:"in_flight"`
	// Capacity is how many requests the node serves for peers at once (0: not said).
	Capacity  int  `json:"capacity,omitempty"`
	Queue     int  `json:"queue"`
	Accepting bool `json:"accepting"`
}

// Thermal states, in increasing severity (the names Apple's ProcessInfo uses).
const (
	ThermalNominal  = "nominal"
	ThermalFair     = "fair"
	ThermalSerious  = "serious"
	ThermalCritical = "critical"
)

// Effective connection types, as the Network Information API names them.
const (
	EffectiveSlow2G = "slow-2g"
	Effective2G     = "2g"
	Effective3G     = "3g"
	Effective4G     = "4g"
)

// RuntimeDesktop is the runtime of a native meshinfer process.
const RuntimeDesktop = "desktop"

// Clone returns a deep copy, so a snapshot handed out can never be changed through the copy.
func (v *Vector) Clone() *Vector {
	if v == nil {
		return nil
	}
	c := *v
	// slices.Clone keeps nil as nil and empty as empty: "gpu":[] and "gpu":null encode
	// differently, and the signature covers the encoding.
	c.CPU.ISA = slices.Clone(v.CPU.ISA)
	c.GPU = slices.Clone(v.GPU)
	c.Models = slices.Clone(v.Models)
	return &c
}

// EffectiveType classifies a connection from its round-trip time and downlink the way browsers
// do (WICG Network Information API table): slow-2g at RTT ≥ 2000 ms or < 0.05 Mbps, 2g at
// ≥ 1400 ms or < 0.07 Mbps, 3g at ≥ 270 ms or < 0.7 Mbps, otherwise 4g. An unknown downlink (0)
// is judged on RTT alone.
func EffectiveType(rttMS, downlinkMbps float64) string {
	known := downlinkMbps > 0
	switch {
	case rttMS >= 2000 || known && downlinkMbps < 0.05:
		return EffectiveSlow2G
	case rttMS >= 1400 || known && downlinkMbps < 0.07:
		return Effective2G
	case rttMS >= 270 || known && downlinkMbps < 0.7:
		return Effective3G
	default:
		return Effective4G
	}
}
