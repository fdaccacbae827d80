package caps

import "slices"

// Vector is a node's capability vector as announced on the mesh (topic caps/2). Field order
// is part of the signed encoding: append new fields at the end of a struct and bump Domain
// when changing it.
type Vector struct {
	PeerID  string `json:"peer_id"`
	Runtime string `json:"runtime"` // RuntimeBrowser, RuntimeDesktop, RuntimeIOS, RuntimeAndroid
	CPU     CPU    `json:"cpu"`
	// GPU is the accelerator a model would run on (a native node picks the one with the most
	// VRAM); nil, encoded null, when the node has none or cannot tell.
	GPU *GPU `json:"gpu"`
	// GPUs lists every GPU of the node, GPU among them. Runtimes that see one adapter at most
	// (browsers, phones) leave it out.
	GPUs     []GPU   `json:"gpus,omitempty"`
	NPU      NPU     `json:"npu"`
	RAM      RAM     `json:"ram"`
	Battery  Battery `json:"battery"`
	Thermal  string  `json:"thermal"`   // ThermalNominal, ThermalFair, ThermalSerious, ThermalCritical
	AppState string  `json:"app_state"` // AppStateForeground, AppStateBackgroundTask, AppStateBackground
	Net      Net     `json:"net"`
	Models   []Model `json:"models"`
	// Stages lists the layer ranges this node holds for pipelines (see Stage). Left out when
	// none: a vector without stages encodes as it did before the field existed.
	Stages   []Stage `json:"stages,omitempty"`
	Load     Load    `json:"load"`
	Seq      uint64  `json:"seq"`
	IssuedAt int64   `json:"issued_at"`  // unix milliseconds, signer's clock
	Expires  int64   `json:"expires_at"` // unix milliseconds, signer's clock
	Sig      string  `json:"sig,omitempty"`
}

// CPU describes the processor.
type CPU struct {
	Cores int    `json:"cores"`           // logical cores online
	Arch  string `json:"arch"`            // GOARCH-style name: amd64, arm64, wasm, ...
	Model string `json:"model,omitempty"` // model name as the system reports it
	// ISAExt lists the notable instruction-set extensions: avx2, avx512f, neon, ...
	ISAExt []string `json:"isa_ext,omitempty"`
}

// GPU describes one accelerator as the system exposes it.
type GPU struct {
	Vendor string `json:"vendor"`  // nvidia, amd, intel, apple, qualcomm, arm, other
	Model  string `json:"model"`   // marketing or PCI name; "" when unknown
	VRAMMB int64  `json:"vram_mb"` // dedicated memory in MiB; 0 when unknown or shared
	// WebGPU is true when the node's runtime reaches this GPU through WebGPU (a browser, or
	// an app embedding it); native meshinfer nodes send false.
	WebGPU bool `json:"webgpu"`
	Stale  bool `json:"stale,omitempty"` // data comes from a cache older than its refresh period
}

// NPU tells whether a neural accelerator is present, and whose.
type NPU struct {
	Present bool   `json:"present"`
	Vendor  string `json:"vendor"` // intel, amd, apple, qualcomm, ...; "" when unknown or absent
}

// RAM is system memory in MiB.
type RAM struct {
	TotalMB int64 `json:"total_mb"`
	FreeMB  int64 `json:"free_mb"` // MemAvailable, not MemFree: what a new task could use
	// BudgetMB is the memory this node gives to mesh work (--memory-budget): whole models
	// and pipeline stages it holds for peers. 0: none said.
	BudgetMB int64 `json:"budget_mb,omitempty"`
}

// Battery is the power source state. Level and Floor are fractions of a full charge (0-1).
type Battery struct {
	Present  bool    `json:"present"`
	Level    float64 `json:"level"` // 0 when not Present
	Charging bool    `json:"charging"`
	// Floor is the level under which the node stops taking work from the mesh (its
	// participation policy's battery floor), so peers can tell how long it will serve.
	Floor float64 `json:"floor"`
}

// Net is the node's view of its network.
type Net struct {
	Type         string  `json:"type"`          // one of the NetType constants
	RTTMS        float64 `json:"rtt_ms"`        // median libp2p ping RTT to connected peers; 0 when none
	DownlinkMbps float64 `json:"downlink_mbps"` // estimate; 0 when unknown
	Metered      bool    `json:"metered"`
}

// Model is one model this node serves.
type Model struct {
	Name  string `json:"name"`
	State string `json:"state"` // warm or cold
	// Deterministic: the same request always gives the same tokens (the synthetic
	// presets), so a stream cut on another node can be resumed here.
	Deterministic bool `json:"deterministic,omitempty"`
	// The model's size, when the node knows it (the synthetic presets): its layers, its
	// weights in bytes once loaded, and the KV cache of one position across all layers.
	// Routing compares WeightBytes with a node's ram.budget_mb; a model that fits no single
	// node is served by a pipeline of layer ranges. 0 (absent): not said.
	Layers          int   `json:"layers,omitempty"`
	WeightBytes     int64 `json:"weight_bytes,omitempty"`
	KVBytesPerToken int64 `json:"kv_bytes_per_token,omitempty"`
}

// Stage is a contiguous range of a model's layers, [Lo, Hi), that this node holds to run as
// a pipeline stage for heads (the model is one of its models), and whether it is loaded:
// StageLoading while its layers are being loaded, then StageWarm. A range is announced as
// soon as its load starts; one whose load fails is no longer listed. A node holding the
// whole model runs any range of it from the whole model, which models[] reports.
type Stage struct {
	Model string `json:"model"`
	Lo    int    `json:"lo"`
	Hi    int    `json:"hi"`
	State string `json:"state"` // StageLoading or StageWarm
}

// Load is the node's current work.
type Load struct {
	InFlight int `json:"in_flight"`
	// Capacity is how many requests the node serves for peers at once (0: not said).
	Capacity  int  `json:"capacity,omitempty"`
	Queue     int  `json:"queue"`
	Accepting bool `json:"accepting"`
}

// Runtimes: what kind of program announces the vector.
const (
	RuntimeBrowser = "browser" // a web page (js-libp2p)
	RuntimeDesktop = "desktop" // a native meshinfer process
	RuntimeIOS     = "ios"
	RuntimeAndroid = "android"
)

// App states: whether the operating system lets the node run. A desktop node is always
// foreground.
const (
	// AppStateForeground: the app (or page, or process) runs without restriction.
	AppStateForeground = "foreground"
	// AppStateBackgroundTask: in the background with a task the OS granted (iOS
	// BGProcessingTask, an Android foreground service or WorkManager job): it may run, for
	// a while.
	AppStateBackgroundTask = "background-task"
	// AppStateBackground: in the background without a granted task; the OS may suspend it
	// at any moment.
	AppStateBackground = "background"
)

// Thermal states, in increasing severity (the names Apple's ProcessInfo and the browsers'
// Compute Pressure API use).
const (
	ThermalNominal  = "nominal"
	ThermalFair     = "fair"
	ThermalSerious  = "serious"
	ThermalCritical = "critical"
)

// Connection types, as the Network Information API's NetworkInformation.type names them.
const (
	NetBluetooth = "bluetooth"
	NetCellular  = "cellular"
	NetEthernet  = "ethernet"
	NetMixed     = "mixed"
	NetNone      = "none"
	NetOther     = "other"
	NetUnknown   = "unknown"
	NetWiFi      = "wifi"
	NetWiMAX     = "wimax"
)

// Clone returns a deep copy, so a snapshot handed out can never be changed through the copy.
func (v *Vector) Clone() *Vector {
	if v == nil {
		return nil
	}
	c := *v
	if v.GPU != nil {
		g := *v.GPU
		c.GPU = &g
	}
	// slices.Clone keeps nil as nil and empty as empty: "models":[] and "models":null encode
	// differently, and the signature covers the encoding.
	c.CPU.ISAExt = slices.Clone(v.CPU.ISAExt)
	c.GPUs = slices.Clone(v.GPUs)
	c.Models = slices.Clone(v.Models)
	c.Stages = slices.Clone(v.Stages)
	return &c
}
