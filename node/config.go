package node

import (
	"fmt"
	"regexp"
	"slices"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	pionwebrtc "github.com/pion/webrtc/v4"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/participation"
	"github.com/meshinfer/meshinfer/node/console"
	"github.com/meshinfer/meshinfer/node/dispatch"
	"github.com/meshinfer/meshinfer/reputation"
	"github.com/meshinfer/meshinfer/transport"
	"github.com/meshinfer/meshinfer/transport/gateway"
	"github.com/meshinfer/meshinfer/transport/openai"
)

// Role is what a node does for the mesh beyond contributing.
type Role string

const (
	// RoleContributor is a desktop node: it serves and uses the mesh. Every node has it.
	RoleContributor Role = "contributor"
	// RoleBootstrap also helps others join: DHT server mode, circuit relay v2 service and the
	// AutoNAT service.
	RoleBootstrap Role = "bootstrap"
	// RoleCoordinator also serves thin clients: its API asks every request for an API key
	// (transport/gateway), meters each key's usage, answers GET /v1/usage, and may listen on
	// a public address, with TLS.
	RoleCoordinator Role = "coordinator"
)

// Defaults, each the value a Config field takes when left zero.
const (
	// DefaultMesh is the mesh joined when none is named.
	DefaultMesh = "default"
	// DefaultConsoleAddr is the local console; loopback, so nothing else on the network sees it.
	DefaultConsoleAddr = "127.0.0.1:3131"
	// ConsoleOff as ConsoleAddr starts no console.
	ConsoleOff = "off"
	// DefaultAPIAddr is the OpenAI-compatible API: the port mesh-llm users know, loopback.
	DefaultAPIAddr = "127.0.0.1:9337"
	// APIOff as APIAddr starts no API.
	APIOff = "off"
	// DefaultMemoryShare is the share of the memory available at start (MemAvailable) a node
	// gives to mesh work when --memory-budget is not set: half, so the owner's own programs
	// keep the rest. The participation policy's max_memory_share may lower it (eco's is a
	// quarter; standard's is this same half).
	DefaultMemoryShare = 0.5
	// BackendSynth (the default) serves Models with the built-in synthetic transformer;
	// BackendOpenAI forwards them to an OpenAI-compatible server at Upstream.
	BackendSynth  = "synth"
	BackendOpenAI = "openai"
	// DefaultUpstreamKeyEnv is the environment variable the upstream's API key is read from.
	DefaultUpstreamKeyEnv = "MESHINFER_UPSTREAM_KEY"
	// DefaultCloudKeyEnv names the environment variable holding the cloud tier's API key.
	DefaultCloudKeyEnv = "MESHINFER_CLOUD_KEY"
	// DefaultCloudUSDPerMTok is what the router assumes the cloud costs (USD per million
	// tokens, prompt and completion) when --cloud-cost is not given: a small non-zero price,
	// so that cost-first requests stay on this device and the mesh when they can.
	DefaultCloudUSDPerMTok = 1.0
	// DefaultHeartbeat is the capability re-announcement period (see mesh/announce).
	DefaultHeartbeat = 15 * time.Second
	// DefaultConnsLow and DefaultConnsHigh are the connection manager's water marks: trimming
	// starts above High and stops at Low. 64 peers give GossipSub (D=6..12) and the DHT
	// plenty of choice; 128 keeps a desktop's sockets and memory modest.
	DefaultConnsLow  = 64
	DefaultConnsHigh = 128
	// DefaultVerifySample is the share of mesh tasks re-run on a second peer to check the
	// result (0.05, i.e. 5 %): a peer past probation that lies on every task is caught after
	// twenty of its tasks on average, for about 5 % more executions on the mesh (one per
	// sampled task, two when the outputs differ).
	DefaultVerifySample = 0.05
	// DefaultVerifyProbationSample is the share verified when the serving peer is on
	// probation (0.25): new or recently penalized peers, scoring below 60. A new liar is
	// caught after about four tasks, before it has earned full weight.
	DefaultVerifyProbationSample = 0.25
	// VerifyOff as VerifySample turns verification off; as VerifyProbationSample it gives
	// peers on probation no higher rate than VerifySample.
	VerifyOff = dispatch.VerifyOff
)

// DefaultListenAddrs are where a node listens when none are given: TCP and QUIC on 4001 on
// every interface, IPv4 and IPv6.
var DefaultListenAddrs = []string{
	"/ip4/0.0.0.0/tcp/4001",
	"/ip4/0.0.0.0/udp/4001/quic-v1",
	"/ip6/::/tcp/4001",
	"/ip6/::/udp/4001/quic-v1",
}

// Config is everything New needs to assemble a node. The zero value of every field means its
// documented default, except where noted.
type Config struct {
	// Identity is the node's key. When nil, it is loaded from (or created in) DataDir.
	Identity crypto.PrivKey
	// DataDir holds the identity key. Default: DefaultDataDir().
	DataDir string
	// Mesh names the mesh to join; meshes with different names never see each other's
	// announcements. Letters, digits, '-', '_' and '.', at most 64. Default: DefaultMesh.
	Mesh string
	// Roles beyond RoleContributor, which every node has.
	Roles []Role
	// ListenAddrs are libp2p multiaddrs to listen on. Default: DefaultListenAddrs.
	ListenAddrs []string
	// AnnounceAddrs, when set, are the only addresses the node tells its peers (identify,
	// its peer record, AddrInfo) instead of its listen and observed addresses, as kubo's
	// Addresses.Announce: a port forwarded to this node, or (testnet) a fault proxy in front
	// of it that peers must dial. Multiaddrs without /p2p.
	AnnounceAddrs []string
	// Bootstrap peers are dialled at start and whenever the node runs short of connections.
	Bootstrap []peer.AddrInfo
	// MDNS turns on LAN discovery.
	MDNS bool
	// ConsoleAddr is the console's listen address; ConsoleOff disables it. Default:
	// DefaultConsoleAddr. A non-loopback address is refused unless ConsolePublic is set.
	ConsoleAddr   string
	ConsolePublic bool
	// Models are the models this node serves: presets of inference/synth with BackendSynth,
	// the upstream's model names with BackendOpenAI (at least one). None (synth only) means
	// the node serves nothing itself and routes every request to peers.
	Models []string
	// MemoryBudget is the memory this node gives to mesh work, in bytes: the models it holds
	// whole for peers and the pipeline stages it takes (--memory-budget). 0:
	// DefaultMemoryShare of the memory available when the node starts. The effective
	// participation policy's max_memory_share of that memory caps it (Node.MemoryBudget).
	// Announced as ram.budget_mb; a model larger than every node's budget is served by a
	// pipeline of layer ranges.
	MemoryBudget int64
	// SynthLoadDelay is added to every synthetic model's load, standing for reading weights
	// from disk (synth.WithLoadDelay): the testnet uses it to show real-length cold starts.
	SynthLoadDelay time.Duration
	// SynthLoadGate, when set, holds every synthetic model's load (whole models and layer
	// ranges), after SynthLoadDelay, until it is closed (synth.WithLoadGate): a test hook for
	// watching a load in progress; nil in production.
	SynthLoadGate <-chan struct{}
	// Backend is what serves Models: BackendSynth or BackendOpenAI. Default: BackendSynth.
	Backend string
	// Upstream is the base URL of the OpenAI-compatible server (llama-server, Ollama, vLLM, a
	// cloud API, another node's API) that BackendOpenAI forwards to. Required with it, and
	// only used with it.
	Upstream string
	// UpstreamKeyEnv names the environment variable holding the upstream's API key, sent as a
	// bearer token; unset or empty sends none. Default: DefaultUpstreamKeyEnv.
	UpstreamKeyEnv string
	// Profile is the deployer's participation profile (participation.ProfileEco, Standard,
	// Power, Off); "" means ProfileOverrides.Profile, else participation.DefaultProfile.
	Profile string
	// ProfileOverrides are the deployer's per-field changes to the profile (the --config
	// file).
	ProfileOverrides participation.Overrides
	// Consent, when set, is the owner's consent, used instead of DataDir/consent.json
	// (testnets and tests). Nil reads the file, and re-reads it whenever it changes.
	Consent *participation.Consent
	// ConsentWording is the text the owner is asked to agree to (--consent-text, read with
	// participation.LoadConsentWording); "" means participation.ConsentWording. A consent
	// given to another wording (participation.Consent.GivenFor) counts as not given: the
	// node contributes nothing and uses no cloud until the owner answers again.
	ConsentWording string
	// Prefs are the routing preferences of a request that gives none (in the body or the
	// X-Meshinfer-* headers). Empty fields: inference.DefaultPrefs (mesh, balanced, explicit).
	Prefs inference.Prefs
	// CloudURL is the base URL of the cloud tier, an OpenAI-compatible API; "" means no
	// cloud tier. Only requests whose privacy is "any" may go there.
	CloudURL string
	// CloudKeyEnv names the environment variable holding the cloud's API key (bearer
	// token). Default: DefaultCloudKeyEnv.
	CloudKeyEnv string
	// CloudModels are the model names the cloud is asked for. At least one with CloudURL.
	CloudModels []string
	// CloudUSDPerMTok is the cloud's price per million tokens, for cost and balanced
	// routing. Default: DefaultCloudUSDPerMTok.
	CloudUSDPerMTok float64
	// WebRTCAccept makes the node answer peers' WebRTC set-ups: direct paths a peer sets
	// up to send it requests (a request whose transport is webrtc), and direct tasks a
	// coordinator relays for its thin clients (meshinfer chat --gateway --direct). Off, the
	// node registers neither protocol, so a peer's set-up fails at once and its request
	// goes over libp2p; the node can still send its own requests over WebRTC to peers that
	// accept (Prefs.Transport). The command line's --webrtc turns both on, --webrtc-accept
	// only this.
	WebRTCAccept bool
	// ICEServers are the STUN and TURN servers of WebRTC direct paths (stun:host:port,
	// turn:host:port; TURN credentials from EnvTURNUsername and EnvTURNCredential). None
	// are needed on a LAN or loopback.
	ICEServers []string
	// WebRTCConnectTimeout bounds setting up a WebRTC path to a peer before the request
	// goes over libp2p instead. Default: webrtc.DefaultConnectTimeout (5 s).
	WebRTCConnectTimeout time.Duration
	// PeerFirstTokenTimeout and PeerInterTokenTimeout bound a peer's silence on this node's
	// requests to peers (transport/infer's Client, over libp2p and WebRTC): before the first
	// token, and then between two frames. PeerInterTokenTimeout also bounds a decode step of
	// a pipeline this node heads (transport/stage). Zero: infer.DefaultFirstTokenTimeout
	// (30 s) and infer.DefaultInterTokenTimeout (5 s); a peer frozen mid-stream is found
	// within the latter and the stream resumed elsewhere. Testnets shorten them.
	PeerFirstTokenTimeout, PeerInterTokenTimeout time.Duration
	// PeerOpenTimeout bounds opening a stream for a request to a peer this node has none
	// open to: the dial, and the DHT walk for its addresses (infer.WithOpenTimeout). Zero:
	// infer.DefaultOpenTimeout (10 s); past it the peer is unavailable and the request
	// tries another. Testnets shorten it: a peer on loopback answers within milliseconds.
	PeerOpenTimeout time.Duration
	// WebRTCSettingEngine configures pion (tests: a virtual network, candidate filters);
	// nil means webrtc.DefaultSettingEngine().
	WebRTCSettingEngine *pionwebrtc.SettingEngine
	// TLSCert and TLSKey are PEM files: with both, the API serves HTTPS.
	TLSCert, TLSKey string
	// InsecureGateway lets a coordinator's API listen on a non-loopback address without
	// TLS (a TLS proxy in front of it).
	InsecureGateway bool
	// GatewayOrigins are the origins of browser apps allowed to call a coordinator's
	// gateway besides its own (hosts or path.Match globs: "app.example.com",
	// "*.example.com"); see transport/gateway's origins.go.
	GatewayOrigins []string
	// APIAddr is the OpenAI-compatible API's listen address; APIOff disables it. Default:
	// DefaultAPIAddr. A non-loopback address is refused unless APIPublic is set.
	APIAddr   string
	APIPublic bool
	// Heartbeat is the capability re-announcement period. Default: DefaultHeartbeat.
	Heartbeat time.Duration
	// ConnsLow and ConnsHigh are the connection manager's water marks.
	ConnsLow, ConnsHigh int
	// LimitLoopback applies the resource manager's per-IP connection cap (host.go) to
	// loopback addresses too. go-libp2p exempts 127.0.0.0/8 and ::1 by default, so that a
	// testnet's nodes, all on 127.0.0.1, are not taken for one host's Sybils; tests of the
	// cap set it and bind peers to distinct 127.0.0.x. (GossipSub's IP colocation penalty
	// ignores loopback addresses whatever this says: see mesh/announce's PeerScore.)
	LimitLoopback bool
	// PubsubOptions are appended to GossipSub's options after the node's own: a test hook
	// (a score inspector, pubsub.WithPeerScoreInspect, must come after the node's
	// pubsub.WithPeerScore; a raw tracer). Nil in production.
	PubsubOptions []pubsub.Option
	// Loopback configures the node for a testnet on one machine: no NAT traversal services,
	// DHT in server mode (loopback addresses are never "public"), no mDNS, and no DHT
	// routing-table refresh, DHT rendezvous or GossipSub peer exchange (on one machine they
	// make every node dial dozens of others; see testnet's package doc).
	Loopback bool
	// VerifySample is the probability (in [0, 1]) that a request served by one peer with a
	// deterministic model is run again on a second peer and the two outputs compared (see
	// node/dispatch/verify.go). A zero value means DefaultVerifySample, so a real 0 cannot be
	// written: VerifyOff turns verification off (probation included).
	VerifySample float64
	// VerifyProbationSample is the probability used instead when it is higher and the
	// serving peer scores below 60 (new or recently penalized peers). Default:
	// DefaultVerifyProbationSample; VerifyOff: no higher rate on probation.
	VerifyProbationSample float64
	// VoterMinKnown and VoterMinScore vet the peers that may vote in a verification
	// (node/dispatch/verify.go): known for at least VoterMinKnown and scoring at least
	// VoterMinScore here, besides being connected and on a host apart. Defaults:
	// dispatch.DefaultVoterMinKnown (10 min) and dispatch.DefaultVoterMinScore (60). Tests
	// that start their peers just before lower them; with Loopback, each loopback address
	// counts as a host of its own.
	VoterMinKnown time.Duration
	VoterMinScore float64
	// WrapBackend, when set, wraps the backend serving Models (synthetic or upstream) before
	// anything uses it: the peer server, the local tier and the announced model list all
	// see the wrapper. A test and testnet hook for injecting faults (testnet.Faults); nil in
	// production.
	WrapBackend func(inference.Backend) inference.Backend
	// WrapStages, when set, wraps the layer ranges this node runs as a pipeline stage (tests:
	// a stage that stops at a given step).
	WrapStages func(inference.StageBackend) inference.StageBackend
	// Reputation, when set, replaces reputation.DefaultParams() as the parameters of the
	// node's reputation store, validated by reputation.New (tests: a Retain of seconds, so
	// that peers that left are seen forgotten; a smaller cap). Nil in production.
	Reputation *reputation.Params
	// ProbeRoot is the filesystem root the capability probe reads /proc and /sys under.
	// Default: "/".
	ProbeRoot string
	// Version is reported on the console and in identify.
	Version string
	// Now is the clock. Default: time.Now.
	Now func() time.Time
}

var meshName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// withDefaults validates cfg and fills in defaults.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.Mesh == "" {
		cfg.Mesh = DefaultMesh
	}
	if !meshName.MatchString(cfg.Mesh) {
		return cfg, fmt.Errorf("mesh name %q: use 1 to 64 letters, digits, '-', '_' or '.'", cfg.Mesh)
	}
	for _, r := range cfg.Roles {
		switch r {
		case RoleContributor, RoleBootstrap, RoleCoordinator:
		default:
			return cfg, fmt.Errorf("role %q: known roles are %s, %s and %s", r, RoleContributor, RoleBootstrap, RoleCoordinator)
		}
	}
	if err := gateway.CheckOriginPatterns(cfg.GatewayOrigins); err != nil {
		return cfg, fmt.Errorf("gateway origins: %w", err)
	}
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return cfg, fmt.Errorf("TLS needs both a certificate and a key (--tls-cert and --tls-key)")
	}
	if cfg.HasRole(RoleCoordinator) {
		if cfg.DataDir == "" && cfg.Identity != nil {
			return cfg, fmt.Errorf("a coordinator keeps its API keys and usage in a data dir: give one (--data-dir)")
		}
		// A coordinator serves clients over the network: its API may listen publicly, but
		// not in clear text, which would carry API keys and prompts readable on the wire.
		cfg.APIPublic = true
		if cfg.APIAddr != APIOff && cfg.TLSCert == "" && !cfg.InsecureGateway && transport.CheckLoopback(cfg.apiAddrOrDefault()) != nil {
			return cfg, fmt.Errorf("the gateway on %s would carry API keys and prompts in clear text: give --tls-cert and --tls-key, "+
				"or --insecure-gateway if a TLS proxy in front of it terminates TLS", cfg.apiAddrOrDefault())
		}
	}
	if len(cfg.ListenAddrs) == 0 {
		cfg.ListenAddrs = slices.Clone(DefaultListenAddrs)
	}
	if cfg.ConsoleAddr == "" {
		cfg.ConsoleAddr = DefaultConsoleAddr
	}
	if cfg.ConsoleAddr != ConsoleOff {
		if err := console.CheckAddr(cfg.ConsoleAddr, cfg.ConsolePublic); err != nil {
			return cfg, err
		}
	}
	if cfg.Backend == "" {
		cfg.Backend = BackendSynth
	}
	switch cfg.Backend {
	case BackendSynth:
		if cfg.Upstream != "" {
			return cfg, fmt.Errorf("upstream %q is only used with backend %s (--backend %s)", cfg.Upstream, BackendOpenAI, BackendOpenAI)
		}
	case BackendOpenAI:
		if cfg.Upstream == "" {
			return cfg, fmt.Errorf("backend %s needs the upstream server's base URL (--upstream URL)", BackendOpenAI)
		}
		if len(cfg.Models) == 0 {
			return cfg, fmt.Errorf("backend %s needs at least one of the upstream's model names (--model NAME)", BackendOpenAI)
		}
	default:
		return cfg, fmt.Errorf("backend %q: known backends are %s and %s", cfg.Backend, BackendSynth, BackendOpenAI)
	}
	if cfg.UpstreamKeyEnv == "" {
		cfg.UpstreamKeyEnv = DefaultUpstreamKeyEnv
	}
	cfg.Prefs = cfg.Prefs.Or(inference.DefaultPrefs())
	if err := cfg.Prefs.Validate(); err != nil {
		return cfg, fmt.Errorf("default routing preferences: %w", err)
	}
	if cfg.CloudURL != "" && len(cfg.CloudModels) == 0 {
		return cfg, fmt.Errorf("cloud %q needs at least one model name it serves (--cloud-model NAME)", cfg.CloudURL)
	}
	if cfg.CloudURL == "" && len(cfg.CloudModels) > 0 {
		return cfg, fmt.Errorf("cloud models %v given without a cloud (--cloud-url URL)", cfg.CloudModels)
	}
	if cfg.CloudKeyEnv == "" {
		cfg.CloudKeyEnv = DefaultCloudKeyEnv
	}
	if cfg.CloudUSDPerMTok == 0 {
		cfg.CloudUSDPerMTok = DefaultCloudUSDPerMTok
	}
	if cfg.CloudUSDPerMTok < 0 {
		return cfg, fmt.Errorf("cloud cost %v USD per million tokens is negative", cfg.CloudUSDPerMTok)
	}
	if cfg.APIAddr == "" {
		cfg.APIAddr = DefaultAPIAddr
	}
	if cfg.APIAddr != APIOff {
		if err := openai.CheckAddr(cfg.APIAddr, cfg.APIPublic); err != nil {
			return cfg, err
		}
	}
	if len(cfg.ConsentWording) > participation.MaxConsentWording {
		return cfg, fmt.Errorf("consent wording of %d bytes: at most %d KiB", len(cfg.ConsentWording), participation.MaxConsentWording>>10)
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.Heartbeat < 100*time.Millisecond {
		return cfg, fmt.Errorf("heartbeat %v is too short (min 100ms)", cfg.Heartbeat)
	}
	if cfg.ConnsLow == 0 {
		cfg.ConnsLow = DefaultConnsLow
	}
	if cfg.ConnsHigh == 0 {
		cfg.ConnsHigh = DefaultConnsHigh
	}
	if cfg.ConnsLow < 1 || cfg.ConnsHigh < cfg.ConnsLow {
		return cfg, fmt.Errorf("connection water marks low %d high %d: need 1 <= low <= high", cfg.ConnsLow, cfg.ConnsHigh)
	}
	if cfg.VerifySample == 0 {
		cfg.VerifySample = DefaultVerifySample
	}
	if cfg.VerifyProbationSample == 0 {
		cfg.VerifyProbationSample = DefaultVerifyProbationSample
	}
	for _, v := range []struct {
		name string
		p    float64
	}{{"verification sample", cfg.VerifySample}, {"probation verification sample", cfg.VerifyProbationSample}} {
		if v.p != VerifyOff && !(v.p >= 0 && v.p <= 1) {
			return cfg, fmt.Errorf("%s %v: need a probability in [0, 1], or %v for off", v.name, v.p, VerifyOff)
		}
	}
	if cfg.VoterMinKnown < 0 {
		return cfg, fmt.Errorf("verification voters known for %v: need a duration of at least 0", cfg.VoterMinKnown)
	}
	if !(cfg.VoterMinScore >= 0 && cfg.VoterMinScore <= 100) {
		return cfg, fmt.Errorf("verification voter score %v: need a score in [0, 100]", cfg.VoterMinScore)
	}
	if cfg.VoterMinKnown == 0 {
		cfg.VoterMinKnown = dispatch.DefaultVoterMinKnown
	}
	if cfg.VoterMinScore == 0 {
		cfg.VoterMinScore = dispatch.DefaultVoterMinScore
	}
	if cfg.ProbeRoot == "" {
		cfg.ProbeRoot = "/"
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Identity == nil && cfg.DataDir == "" {
		dir, err := DefaultDataDir()
		if err != nil {
			return cfg, err
		}
		cfg.DataDir = dir
	}
	return cfg, nil
}

func (cfg Config) apiAddrOrDefault() string {
	if cfg.APIAddr == "" {
		return DefaultAPIAddr
	}
	return cfg.APIAddr
}

// HasRole reports whether the node has role r.
func (cfg Config) HasRole(r Role) bool {
	if r == RoleContributor {
		return true
	}
	for _, have := range cfg.Roles {
		if have == r {
			return true
		}
	}
	return false
}
