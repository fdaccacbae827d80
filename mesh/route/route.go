package route

import (
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/registry"
	"github.com/meshinfer/meshinfer/reputation"
)

// Tier is where a target runs: inference's tiers, so that a decision's target and where a
// request was served (inference.Served) name a tier the same way.
type Tier = inference.Tier

// Tiers, in the order that wins ties.
const (
	TierLocal = inference.TierLocal // this node's own backend
	TierMesh  = inference.TierMesh  // a peer
	TierCloud = inference.TierCloud // the configured cloud API
)

// CloudTarget is the cloud tier's key in the reputation store. Peer IDs are multihashes in
// base58 or base32, so they never equal it.
const CloudTarget = "cloud"

// Target is one place a request can be served.
type Target struct {
	Tier  Tier
	Peer  peer.ID // TierMesh only, one peer serving the whole model
	Model string  // the model to run there
	// Stages, instead of Peer, are the pipeline serving a model no single peer holds
	// (TierMesh only), in chain order.
	Stages []inference.StageHop
}

// String is the route as the API reports it: "local", "peer:<peer ID>", "pipeline:…" or
// "cloud" (inference.Served's Route).
func (t Target) String() string {
	s := inference.Served{Tier: t.Tier, Stages: t.Stages}
	if t.Tier == TierMesh && len(t.Stages) == 0 {
		s.Peer = t.Peer.String()
	}
	return s.Route()
}

// RepKey is the target's key in the reputation store: reputation.LocalTarget, the peer ID
// string, or CloudTarget; "" for a pipeline, whose outcomes are recorded per stage.
func (t Target) RepKey() string {
	switch {
	case t.Tier == TierLocal:
		return reputation.LocalTarget
	case t.Tier == TierMesh && len(t.Stages) > 0:
		return ""
	case t.Tier == TierMesh:
		return t.Peer.String()
	}
	return CloudTarget
}

// LocalModel is one model this node's backend serves.
type LocalModel struct {
	Name          string
	Warm          bool
	Deterministic bool
	TokensPerSec  float64       // measured on this node; 0 = unknown
	ColdStart     time.Duration // expected load time when cold; 0 = unknown
}

// Local is this node's own backend.
type Local struct {
	Accepting bool // a backend exists and the node's policy lets it serve
	Models    []LocalModel
}

// Peer is one peer of the registry as the router sees it.
type Peer struct {
	Entry registry.Entry // from the registry
	RTT   time.Duration  // from the peerstore; 0 = unknown
	// Unconnected: this node holds no connection to the peer now (it may have left: its
	// vector stays fresh for a few heartbeats after it went). Decide tries clean peers it
	// is connected to first (doc.go, "Mesh order"). The zero value, connected or unknown,
	// changes nothing.
	Unconnected bool
	// Silent: a request of this node has waited on the peer for its first token longer
	// than a healthy peer takes (the executor's Config.SilentAfter): the peer may be
	// frozen, and the requests that would show it have not timed out yet. Decide tries it
	// with the unconnected clean peers, after the connected ones that are not silent.
	Silent bool
	// Key is Entry.Peer.String(), the peer's key in the reputation store, when the caller
	// has it cached; "" makes Decide encode it. Encoding costs about 1.5 µs a peer, which
	// over 1,000 peers is thirty times the decision's budget.
	Key string
}

// Cloud is the cloud tier.
type Cloud struct {
	Enabled bool     // configured, and privacy/consent checks are the caller's: Enabled means usable
	Models  []string // models the cloud serves; empty means any name may be tried
	// Deterministic lists the models the cloud says it serves deterministically (another
	// meshinfer node's API says so of the built-in models): a cut stream may be resumed
	// there. Decide does not read it.
	Deterministic []string
	TTFT          time.Duration // measured time to first token (EWMA) or configured; 0 = Tuning default
	TokensPerSec  float64       // 0 = Tuning default
	USDPerMTok    float64       // cost per million tokens, prompt + completion
}

// Tuning holds the router's estimates and limits. A zero (or negative) field takes
// DefaultTuning's value.
type Tuning struct {
	DefaultTokensPerSec   float64       // when a tier's speed is unknown (tokens/s)
	DefaultColdStart      time.Duration // when a cold model's load time is unknown
	DefaultCloudTTFT      time.Duration // when the cloud's time to first token is unknown
	BalancedSecondsPerUSD float64       // balanced priority counts 1 USD as this many seconds
	MaxMeshAttempts       int           // peers in a plan
	ColdFactor            float64       // weight multiplier for a peer whose model is cold
	LatencySlack          time.Duration // added to both sides of the latency rule's ratio
}

// Default tuning values.
const (
	// DefaultTokensPerSec (50 tokens/s) is what a 7–8B model quantised to 4 bits generates
	// on a recent laptop GPU or Apple silicon: the common mesh node.
	DefaultTokensPerSec = 50.0
	// DefaultColdStart (2 s) is loading such a model (about 4 GiB) from a fast SSD.
	DefaultColdStart = 2 * time.Second
	// DefaultCloudTTFT (400 ms) is a hosted API's usual time to first token for a small
	// model, network included.
	DefaultCloudTTFT = 400 * time.Millisecond
	// DefaultBalancedSecondsPerUSD (100 s/USD) makes one cent weigh as much as one second
	// of waiting: a cheap cloud call beats a much slower free tier, an expensive one not.
	DefaultBalancedSecondsPerUSD = 100.0
	// DefaultMaxMeshAttempts (3 peers) rides out two failures in a row without queueing a
	// long tail of timeouts behind the request.
	DefaultMaxMeshAttempts = 3
	// DefaultColdFactor (0.5) halves the share of a peer that would first have to load the
	// model (about DefaultColdStart of extra latency) against one that has it warm.
	DefaultColdFactor = 0.5
	// DefaultLatencySlack (50 ms) is added to a peer's estimated time to first token and to
	// the quickest peer's in the latency rule, so that differences well under what a person
	// notices (a few ms on a LAN, jitter) barely move traffic, while a peer hundreds of ms
	// slower loses most of it.
	DefaultLatencySlack = 50 * time.Millisecond
)

// DefaultTuning returns the default tuning.
func DefaultTuning() Tuning {
	return Tuning{
		DefaultTokensPerSec:   DefaultTokensPerSec,
		DefaultColdStart:      DefaultColdStart,
		DefaultCloudTTFT:      DefaultCloudTTFT,
		BalancedSecondsPerUSD: DefaultBalancedSecondsPerUSD,
		MaxMeshAttempts:       DefaultMaxMeshAttempts,
		ColdFactor:            DefaultColdFactor,
		LatencySlack:          DefaultLatencySlack,
	}
}

// withDefaults fills t's zero or negative fields from DefaultTuning. The comparisons are
// written so that NaN takes the default too.
func (t Tuning) withDefaults() Tuning {
	d := DefaultTuning()
	if !(t.DefaultTokensPerSec > 0) {
		t.DefaultTokensPerSec = d.DefaultTokensPerSec
	}
	if t.DefaultColdStart <= 0 {
		t.DefaultColdStart = d.DefaultColdStart
	}
	if t.DefaultCloudTTFT <= 0 {
		t.DefaultCloudTTFT = d.DefaultCloudTTFT
	}
	if !(t.BalancedSecondsPerUSD > 0) {
		t.BalancedSecondsPerUSD = d.BalancedSecondsPerUSD
	}
	if t.MaxMeshAttempts <= 0 {
		t.MaxMeshAttempts = d.MaxMeshAttempts
	}
	if !(t.ColdFactor > 0) {
		t.ColdFactor = d.ColdFactor
	}
	if t.LatencySlack <= 0 {
		t.LatencySlack = d.LatencySlack
	}
	return t
}

// Snapshot is what the router knows at the moment of a decision. Decide reads it and
// writes only Scratch.
type Snapshot struct {
	Local          Local
	Peers          []Peer // distinct peers, as the registry lists them
	Cloud          Cloud
	Rep            *reputation.Store // nil: no reputation filtering/weighting (score 50, performance 1)
	MeshUSDPerMTok float64           // cost of the mesh tier (0 by default)
	Tune           Tuning            // zero fields take DefaultTuning's
	Scratch        *Scratch          // working memory to reuse; nil: Decide allocates its own
}

// Scratch is working memory that Decide reuses from one call to the next, so that a
// decision over 1,000 peers allocates a few hundred bytes instead of about 80 KB (about
// 50 µs of allocation and page faults on a 2-core VM, the whole decision budget). Nothing
// in a Decision refers to it. A Scratch serves one Decide call at a time: keep one per
// goroutine, or in a sync.Pool. Its zero value is ready to use.
type Scratch struct {
	peers []meshPeer // eligible peers
	keys  []string   // reputation keys: eligible peers, then local and cloud
	cands []reputation.Candidate
	pos   []int // index in keys of each target RankIndices kept
}

// Estimate is what one tier would cost the request.
type Estimate struct {
	Tier  Tier
	OK    bool          // the tier can serve the model
	TTFT  time.Duration // estimated time to first token
	Total time.Duration // TTFT + completion tokens ÷ tokens/s
	USD   float64
	Why   string // when !OK, a short reason ("privacy mesh", "no peer serves m", "cloud not configured", "local m cooling"...)
}

// Decision is the router's answer for one request.
type Decision struct {
	Model       string     // the model chosen (== request's unless route auto picked another)
	Attempts    []Target   // in order: the router tries the next on failure
	Speculative bool       // Attempts[0] is a cold local target and Attempts[1] the cloud: start the cloud stream while local loads
	Estimates   []Estimate // one per tier, in tier order local, mesh, cloud (for logs, tests and status)
	// Penalized: Attempts put a penalized peer behind a clean one. The executor counts it
	// in reputation (Store.CountPenalizedRoute: routes_penalized in /api/status).
	Penalized bool
}
