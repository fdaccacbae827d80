// Package console serves the node's local console: a small read-only HTTP API on loopback.
//
//	GET /api/status   this node: identity, roles, mesh counts, listen addresses, uptime, its
//	                  own signed capability vector, announcement counters
//	GET /api/peers    every known peer: verified capability vector, age, connected, stale,
//	                  reputation, measured bandwidth, and its open connections (transport,
//	                  multiplexer)
//	GET /health       liveness: always 200 while the process serves; "ready" in the body
//	GET /health/ready readiness: 200 once bootstrapped and announcing, else 503
//
// The JSON shapes are the types in this file; `meshinfer status` decodes them with the same
// types. Handlers read a snapshot from their Source and never block on the mesh.
//
// The listener must be loopback unless the operator explicitly allows otherwise (Public):
// the console shows the node's peers and addresses, which are nobody else's business.
//
// Slow and greedy clients get what the API's do (transport.HTTPLimits), with the console's
// figures: 5 s for a request's header, 10 s for the whole request, 30 s for an idle
// kept-alive connection, 32 KiB of header, and at most 32 connections per client address,
// loopback included (a browser page or another local user reaches it too).
package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	logging "github.com/ipfs/go-log/v2"

	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/mesh/participation"
	"github.com/meshinfer/meshinfer/mesh/registry"
	"github.com/meshinfer/meshinfer/transport"
)

var log = logging.Logger("node/console")

// Status is the body of GET /api/status.
type Status struct {
	NodeID        string        `json:"node_id"`
	Version       string        `json:"version"`
	Roles         []string      `json:"roles"`
	Mesh          Mesh          `json:"mesh"`
	ListenAddrs   []string      `json:"listen_addrs"`
	UptimeS       float64       `json:"uptime_s"`
	Ready         bool          `json:"ready"`
	Capability    *caps.Vector  `json:"capability"`
	Announcements Announcements `json:"announcements"`
	// Inference is this node's serving side; RoutingAffinity its routing memory.
	Inference       Inference       `json:"inference"`
	Routing         Routing         `json:"routing"`
	Participation   Participation   `json:"participation"`
	RoutingAffinity RoutingAffinity `json:"routing_affinity"`
	// WebRTC is the node's direct paths; absent when it runs none.
	WebRTC *WebRTC `json:"webrtc,omitempty"`
	// Pipelines are the pipelines of layer ranges this node heads or serves a stage of.
	Pipelines Pipelines `json:"pipelines"`
	// Migration is how the cut generations of this node's requests went on.
	Migration Migration `json:"migration"`
}

// Migration is what the viability gate (mesh/route Gate) decided for the streams of this
// node's requests cut mid-way: how many of each choice, and the last decisions with their
// inputs, estimate and what really happened.
type Migration struct {
	// Decisions counts the decisions by choice: live_transfer, replay, restart_peer,
	// restart_cloud, none.
	Decisions map[string]uint64   `json:"decisions"`
	Recent    []MigrationDecision `json:"recent"`
}

// MigrationDecision is one gate decision. Times are in milliseconds.
type MigrationDecision struct {
	At     time.Time `json:"at"`
	Model  string    `json:"model"`
	Choice string    `json:"choice"`
	Why    string    `json:"why"`
	// Inputs are the figures the gate had; OptionsMS the estimate of every option that was
	// possible; EstimateMS the chosen one's.
	Inputs     GateInputs         `json:"inputs"`
	OptionsMS  map[string]float64 `json:"options_ms"`
	EstimateMS float64            `json:"estimate_ms"`
	// TookMS is the time from the decision to the request's end, Outcome how it ended
	// ("completed", an error code, or "running"), Route where its last attempt ran.
	TookMS  float64 `json:"took_ms"`
	Outcome string  `json:"outcome"`
	Route   string  `json:"route,omitempty"`
}

// GateInputs are a gate decision's inputs (mesh/route GateInput); 0 is not measured.
type GateInputs struct {
	PromptTokens  int     `json:"prompt_tokens"`
	Generated     int     `json:"generated"`
	Remaining     int     `json:"remaining"`
	Deterministic bool    `json:"deterministic"`
	SourceUp      bool    `json:"source_up"`
	KVBytes       int64   `json:"kv_bytes"`
	Replacement   bool    `json:"replacement"`
	BandwidthMbps float64 `json:"bandwidth_mbps"`
	RTTMS         float64 `json:"rtt_ms"`
	PrefillTPS    float64 `json:"prefill_tps"`
	DecodeTPS     float64 `json:"decode_tps"`
	ColdStartMS   float64 `json:"cold_start_ms"`
	Cloud         bool    `json:"cloud"`
	CloudTTFTMS   float64 `json:"cloud_ttft_ms"`
	CloudTPS      float64 `json:"cloud_tps"`
	BudgetMS      float64 `json:"budget_ms"`
}

// Routing counts what the router did with this node's API requests. Counters only: no
// prompt or output content appears on any status surface.
type Routing struct {
	// Requests counts requests by the tier of their last attempt; no_target those no tier
	// could serve. Local-only requests are counted under LocalOnly instead.
	Requests TierCounts `json:"requests"`
	// LocalOnly counts requests handled by the privacy gate (privacy local-only).
	LocalOnly LocalOnly `json:"local_only"`
	// Speculative counts cloud streams started while a cold local model loaded: cancelled
	// when local was ready first, kept when the cloud's first token came first. The rest
	// ended otherwise (the cloud failed before its first token, or the client left).
	Speculative Speculative `json:"speculative"`
	// Failovers counts attempts that followed a failure before the first token;
	// Resumptions those that continued a stream cut mid-way; ResumeMismatches resumptions
	// refused because the regenerated tokens differed from those already sent.
	Failovers        uint64 `json:"failovers"`
	Resumptions      uint64 `json:"resumptions"`
	ResumeMismatches uint64 `json:"resume_mismatches"`
	// ProbeReruns counts capability probe re-runs after a degraded route (a peer timing
	// out, the cloud failing).
	ProbeReruns uint64 `json:"probe_reruns"`
	// ReceiptsRefused counts, on a coordinator, task receipts from serving peers that were
	// missing, forged or did not match what the client received; those tasks are metered
	// without a receipt.
	ReceiptsRefused uint64 `json:"receipts_refused"`
	// BusyRefusals counts requests refused at once with overloaded because every peer
	// serving the model already ran as many of this node's requests as a peer admits from
	// one requester (8): no round trip to a peer that would refuse.
	BusyRefusals uint64 `json:"busy_refusals"`
	// Direct counts, on a coordinator, direct tasks of thin clients that ended at their
	// peer: the tokens went over the client's WebRTC channel, not through this node.
	Direct uint64 `json:"direct"`
	// Verification counts the mesh results checked against a second peer's execution.
	Verification Verification `json:"verification"`
}

// WebRTC counts the node's WebRTC direct paths: PeerConnections kept warm, data channels
// open, and how mesh attempts that asked for WebRTC went.
type WebRTC struct {
	Accepting     bool   `json:"accepting"`      // the node answers peers' set-ups (--webrtc or --webrtc-accept)
	Open          int    `json:"open"`           // connected PeerConnections, either direction
	Streams       int    `json:"streams"`        // data channels open
	WarmHits      uint64 `json:"warm_hits"`      // channels opened on a PeerConnection already up
	ColdSetups    uint64 `json:"cold_setups"`    // PeerConnections this node set up
	Accepted      uint64 `json:"accepted"`       // PeerConnections peers set up to this node
	Relayed       uint64 `json:"relayed"`        // one-shot PeerConnections for thin clients, relayed by a coordinator
	SetupFailures uint64 `json:"setup_failures"` // set-ups that failed or timed out
	IdleClosed    uint64 `json:"idle_closed"`    // PeerConnections closed after 2 min without a channel
	Dispatched    uint64 `json:"dispatched"`     // mesh attempts completed over a data channel
	Fallbacks     uint64 `json:"fallbacks"`      // attempts sent over libp2p: no path in time, or broken before the first token
}

// Verification counts sampled verification: a task served by one plan (a peer, or a
// pipeline of stages) with a deterministic model is run again on a second plan and the
// outputs compared; on a mismatch a third plan decides, two out of three. Every sampled
// task ends in exactly one of passed, failed, inconclusive and skipped, so sampled =
// passed + failed + inconclusive + skipped once none is in flight; skipped_unvetted is a
// part of skipped.
type Verification struct {
	// Sampled counts tasks drawn for verification.
	Sampled uint64 `json:"sampled"`
	// Passed counts verifications where every execution gave the same output.
	Passed uint64 `json:"passed"`
	// Failed counts verifications that settled a mismatch two to one: the odd plan out,
	// the serving one or a verifier's, took an integrity penalty if it was one peer; if it
	// was a pipeline, its stages were isolated (the Stages counters below).
	Failed uint64 `json:"failed"`
	// Inconclusive counts mismatches nobody could settle (no third peer, three different
	// outputs) and verifications cut short by a transport failure; nobody is penalized.
	Inconclusive uint64 `json:"inconclusive"`
	// Skipped counts sampled tasks not verified: no second peer served the model, none of
	// those that did was a vetted voter, or too many verifications were already running.
	Skipped uint64 `json:"skipped"`
	// SkippedUnvetted counts the skipped tasks that other peers served the model for but
	// none was a vetted voter (connected, established, reputed, on another host; see
	// node/dispatch/verify.go): part of Skipped, not in addition to it.
	SkippedUnvetted uint64 `json:"skipped_unvetted"`
	// StagesIsolated counts the stages of outvoted pipelines that isolation settled: each
	// stage of a pipeline that was the odd plan out runs the request again with vetted
	// peers holding every other layer (node/dispatch/verify.go, "Who is penalized"), and is
	// cleared or convicted.
	StagesIsolated uint64 `json:"stages_isolated"`
	// StagesConvicted counts the isolated stages whose output differed from the two other
	// plans', in two runs with helpers apart: each took the integrity penalty. A part of
	// StagesIsolated.
	StagesConvicted uint64 `json:"stages_convicted"`
	// StagesInconclusive counts the stages of outvoted pipelines that isolation did not
	// settle (no vetted peers to hold the other layers, a failed run, two runs disagreeing,
	// past the 8 stages isolated at most): nobody penalized. StagesIsolated +
	// StagesInconclusive is the stages of every outvoted pipeline.
	StagesInconclusive uint64 `json:"stages_inconclusive"`
}

// Participation is whether and on what terms this node contributes to the mesh.
type Participation struct {
	Consent Consent `json:"consent"`
	// Profile is the deployer's profile (eco, standard, power, off).
	Profile string `json:"profile"`
	// Thresholds is the effective policy: the stricter of the deployer's profile (with its
	// overrides) and the owner's consent, field by field.
	Thresholds participation.Policy `json:"thresholds"`
	// Admission is "accepting" or "paused"; Reasons says why (battery_low, not_charging,
	// thermal, app_background, metered, bandwidth_cap, rate_limited, no_consent,
	// sensors_silent, profile_off).
	Admission string   `json:"admission"`
	Reasons   []string `json:"reasons"`
	// MeshBytesLastHour is the mesh traffic of the tasks this node served for peers in the
	// last hour, bytes in and out: what Thresholds.MaxBytesPerHour caps.
	MeshBytesLastHour int64 `json:"mesh_bytes_last_hour"`
}

// Consent is the owner's recorded consent.
type Consent struct {
	Given bool `json:"given"`
	// WordingChanged: a consent is recorded, but given to another wording than the one this
	// node runs with (--consent-text), so it counts as not given until the owner answers
	// again with 'meshinfer consent'.
	WordingChanged bool   `json:"wording_changed,omitempty"`
	Version        int    `json:"version,omitempty"`
	GivenAt        string `json:"given_at,omitempty"`
	RunLocal       bool   `json:"run_local"`
	Contribute     bool   `json:"contribute"`
	CloudFallback  bool   `json:"cloud_fallback"`
}

// TierCounts counts requests per tier.
type TierCounts struct {
	Local    uint64 `json:"local"`
	Mesh     uint64 `json:"mesh"`
	Cloud    uint64 `json:"cloud"`
	NoTarget uint64 `json:"no_target"`
}

// LocalOnly counts the privacy gate's outcomes.
type LocalOnly struct {
	Served  uint64 `json:"served"`
	Refused uint64 `json:"refused"` // local_unavailable
	Failed  uint64 `json:"failed"`
}

// Speculative counts speculative dispatch.
type Speculative struct {
	Started   uint64 `json:"started"`
	Cancelled uint64 `json:"cancelled"`
	Kept      uint64 `json:"kept"`
}

// Inference describes what this node serves and how its peer server is doing.
type Inference struct {
	API    string   `json:"api"`    // OpenAI-compatible API address, "" when off
	Models []string `json:"models"` // models this node serves itself
	// Peer-protocol server counters: requests from other nodes.
	InFlight           int64  `json:"in_flight"`
	Served             uint64 `json:"served"`
	Failed             uint64 `json:"failed"`
	Overloaded         uint64 `json:"overloaded"`
	ClientDisconnected uint64 `json:"client_disconnected"`
	// Moved counts the generations handed over to another peer, with their KV cache, when
	// this node paused or drained.
	Moved uint64 `json:"moved"`
}

// RoutingAffinity is what the node's routing has learned (mesh-llm's field name).
type RoutingAffinity struct {
	TargetReputation TargetReputation `json:"target_reputation"`
}

// TargetReputation summarizes the reputation store.
type TargetReputation struct {
	PenalizedTargets int    `json:"penalized_targets"` // (model, target) pairs still penalized
	RoutesPenalized  uint64 `json:"routes_penalized"`  // attempt orders that put a penalized peer behind a clean one
	CoolingTargets   int    `json:"cooling_targets"`   // (model, target) pairs in cooldown now
	ExcludedPeers    int    `json:"excluded_peers"`    // peers scored under 40
}

// Pipelines are the pipelines of layer ranges this node heads or runs a stage of (models
// no single node holds).
type Pipelines struct {
	Headed     uint64 `json:"headed"`      // pipelines this node opened as their head
	OpenFailed uint64 `json:"open_failed"` // pipelines whose set-up failed (a stage refused or was unreachable)
	// StageSessions are the stage sessions this node runs for heads now; StageRefused the
	// sessions it refused (over its limits or budget); StageProtocolErrors the streams it
	// reset for a protocol violation.
	StageSessions       int    `json:"stage_sessions"`
	StageRefused        uint64 `json:"stage_refused"`
	StageProtocolErrors uint64 `json:"stage_protocol_errors"`
	// Recent are the pipelines this node heads now (at most 32) and the last 8 it headed,
	// newest first; Sessions the stage sessions it runs for heads now.
	Recent   []HeadedPipeline `json:"recent"`
	Sessions []StageSession   `json:"sessions"`
}

// HeadedPipeline is a pipeline this node heads or headed: its stages, and what its steps
// took. Times are means per step (a step is the prompt, or part of it, or one token),
// in milliseconds.
type HeadedPipeline struct {
	Model     string          `json:"model"`
	Route     string          `json:"route"`      // as X-Meshinfer-Route says it: pipeline:<peer>[0-7],…
	Open      bool            `json:"open"`       // running now
	StartedAt string          `json:"started_at"` // RFC 3339, UTC
	Stages    []PipelineStage `json:"stages"`     // in chain order
	Steps     int             `json:"steps"`
	// StepMS is a step's round trip at this node: from sending its hidden states to the first
	// stage to reading the last stage's output.
	StepMS float64 `json:"step_ms"`
	// HopsMS is the part of StepMS outside the stages' layers: the step's crossings (this
	// node → the first stage, stage to stage, the last stage → this node) and their
	// framing. Left out, as the stages' forward_ms, when the stages do not report their times.
	HopsMS *float64 `json:"hops_ms,omitempty"`
	// Failure is the error code that broke the pipeline (a lost or timed-out stage, …); ""
	// while it is open and when it ended in order.
	Failure string `json:"failure,omitempty"`
	// Moved are the stages that left with notice and were moved live, in order; Route and
	// Stages are then the chain as re-linked (the response's X-Meshinfer-Route, sent with
	// the first token, names the chain as it was opened).
	Moved []PipelineMove `json:"moved,omitempty"`
}

// PipelineMove is a stage moved live: its place in the chain and peer, the hops that took
// its layers (route form: <peer>[lo-hi],…), the positions and bytes of KV cache moved, and
// what the move took at the head, from the decision to the re-linked chain's readiness.
type PipelineMove struct {
	Index     int     `json:"index"`
	From      string  `json:"from"`
	To        string  `json:"to"`
	Positions int     `json:"positions"`
	Bytes     int64   `json:"bytes"`
	TookMS    float64 `json:"took_ms"`
}

// PipelineStage is one stage of a headed pipeline: a peer holding layers [Lo, Hi), and
// the mean time of its layers per step, as it reported it. Once the pipeline ended in
// order, Receipt is the stage's signed receipt of its part (mesh/receipts' stage receipt,
// checked by this node) and Countersig this node's countersignature of it; both absent
// when the stage sent none that held.
type PipelineStage struct {
	Peer       string   `json:"peer"`
	Lo         int      `json:"lo"`
	Hi         int      `json:"hi"`
	ForwardMS  *float64 `json:"forward_ms,omitempty"`
	Receipt    string   `json:"receipt,omitempty"`
	Countersig string   `json:"countersig,omitempty"`
}

// StageSession is a stage session this node runs for a head now: layers [Lo, Hi) of Model,
// its place in the chain, the steps it ran and its layers' mean time per step, in
// milliseconds.
type StageSession struct {
	Model     string  `json:"model"`
	Lo        int     `json:"lo"`
	Hi        int     `json:"hi"`
	Head      string  `json:"head"`   // the head's peer ID
	Index     int     `json:"index"`  // its place in the chain, 0 first
	Stages    int     `json:"stages"` // the chain's length
	Steps     int     `json:"steps"`
	ForwardMS float64 `json:"forward_ms"`
}

// Mesh is the node's view of its mesh.
type Mesh struct {
	Name           string `json:"name"`
	PeersConnected int    `json:"peers_connected"` // direct libp2p connections, any peer
	PeersKnown     int    `json:"peers_known"`     // contacted peers with a verified vector: routing candidates
	// PeersPending are peers whose vector reached this node through others and that it has
	// not yet been connected to: not routing candidates, at most registry.DefaultPendingCap.
	PeersPending int `json:"peers_pending"`
	PeersStale   int `json:"peers_stale"` // known peers silent for over two heartbeats
	TopicPeers   int `json:"topic_peers"` // connected peers subscribed to the caps topic
	DHTPeers     int `json:"dht_peers"`   // peers in the DHT routing table
}

// Announcements counts capability messages.
type Announcements struct {
	Published uint64 `json:"published"`
	Accepted  uint64 `json:"accepted"`
	Rejected  uint64 `json:"rejected"`
	Ignored   uint64 `json:"ignored"`
	// RateLimited counts the announcements ignored because their author was over its rate
	// (mesh/announce: a few back to back, then three per heartbeat); part of Ignored.
	RateLimited uint64 `json:"rate_limited"`
	Synced      uint64 `json:"synced"` // vectors learned by pulling from a newly met peer
	// Contacted and Dropped count pending peers this node connected to, and those it could
	// not reach and dropped.
	Contacted uint64 `json:"contacted"`
	Dropped   uint64 `json:"dropped"`
	// Refused counts the vectors the registry refused: new identities past their source's
	// budget, peers found unreachable, no room; and pending peers evicted.
	Refused registry.Counts `json:"refused"`
}

// Peer is one entry of GET /api/peers.
type Peer struct {
	PeerID    string `json:"peer_id"`
	Connected bool   `json:"connected"`
	// Contacted: this node has been connected to the peer; until then it is pending, not a
	// routing candidate.
	Contacted bool    `json:"contacted"`
	Stale     bool    `json:"stale"`
	AgeS      float64 `json:"age_s"` // seconds since its latest verified vector
	// Score is the peer's reputation (0-100, 50 when unknown; under 40 it is excluded).
	Score    float64 `json:"score"`
	Excluded bool    `json:"excluded"`
	// ScoreReason is what last changed the score: an outcome ("success", "timeout",
	// "unavailable") or an event ("heartbeat_missed", "verification_passed",
	// "verification_failed", "forged_announcement", "malformed_frame", "protocol_violation"),
	// at ScoreChangedAt (RFC 3339, UTC); both empty while the score is untouched.
	ScoreReason    string       `json:"score_reason,omitempty"`
	ScoreChangedAt string       `json:"score_changed_at,omitempty"`
	Capability     *caps.Vector `json:"capability"`
	// Conns are the open libp2p connections to the peer (none when not connected).
	Conns []Conn `json:"conns"`

	// BandwidthMbps is the bandwidth measured with the peer, each way, from the transfers
	// between them (stage prefill steps, long requests, sync answers, bandwidth probes),
	// as an estimate that follows changes within a few transfers and forgets with age
	// (internal/bandwidth); absent until a transfer was measured, a direction 0 until one
	// of its own was. BandwidthMeasuredAt is when the latest sample was taken (RFC 3339,
	// UTC).
	BandwidthMbps       *BandwidthMbps `json:"bandwidth_mbps,omitempty"`
	BandwidthMeasuredAt string         `json:"bandwidth_measured_at,omitempty"`
}

// BandwidthMbps is a peer's measured bandwidth in Mbit/s: Down from the peer to this node,
// Up from this node to the peer (measured by bandwidth probes only).
type BandwidthMbps struct {
	Down float64 `json:"down"`
	Up   float64 `json:"up"`
}

// Conn is one libp2p connection to a peer: what its streams (inference included) run on.
type Conn struct {
	Transport string `json:"transport"` // "tcp", "quic-v1", …
	// Muxer is the stream multiplexer: "/yamux/1.0.0" on TCP, empty where the transport
	// multiplexes (QUIC).
	Muxer     string `json:"muxer"`
	Security  string `json:"security"`  // "/tls/1.0.0", "/noise", empty where built in (QUIC)
	Direction string `json:"direction"` // "inbound" or "outbound"
	Limited   bool   `json:"limited"`   // a relayed connection with the relay's limits
}

// Peers is the body of GET /api/peers.
type Peers struct {
	Peers []Peer `json:"peers"`
}

// Health is the body of GET /health and GET /health/ready.
type Health struct {
	Status string `json:"status"` // "ok" while serving
	Ready  bool   `json:"ready"`
}

// Source is what the console reads. Implementations return snapshots quickly.
type Source interface {
	Status() Status
	Peers() []Peer
	Ready() bool
}

// Server is the console HTTP server.
type Server struct {
	ln   net.Listener
	srv  *http.Server
	wg   sync.WaitGroup
	once sync.Once
}

// Limits of the console's HTTP server (transport.HTTPLimits). Its requests are GETs of a
// few hundred bytes, answered from a snapshot.
const (
	// readTimeout bounds a whole request: nothing but a header is expected, and 10 s leaves
	// net/http room to discard a stray small body.
	readTimeout = 10 * time.Second
	// idleTimeout closes a kept-alive connection unused this long: a dashboard or a status
	// loop polls every few seconds.
	idleTimeout = 30 * time.Second
	// connsPerIP bounds the connections one client holds: a browser opens at most 6 to a
	// host, a status loop 1; 32 leaves room for a few of each.
	connsPerIP = 32
)

// limits are the console's server limits: the constants above and transport's shared ones.
func limits() transport.HTTPLimits {
	l := transport.SharedHTTPLimits()
	l.ReadTimeout, l.IdleTimeout, l.ConnsPerIP = readTimeout, idleTimeout, connsPerIP
	return l
}

// ErrNotLoopback is returned by New for a non-loopback address without Public.
var ErrNotLoopback = transport.ErrNotLoopback

// New listens on addr and serves src. A non-loopback addr is refused unless public is set.
func New(addr string, public bool, src Source) (*Server, error) {
	return listen(addr, public, src, limits())
}

// listen is New with the server's limits l (tests narrow them).
func listen(addr string, public bool, src Source, l transport.HTTPLimits) (*Server, error) {
	if err := CheckAddr(addr, public); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("console listen on %s: %w", addr, err)
	}
	s := &Server{ln: ln}
	h := Handler(src)
	if !public {
		h = transport.LoopbackHosts(h) // no DNS rebinding: the Host must be this machine
	}
	s.srv = l.Server(h)
	// Serve returns when Close shuts the server down.
	s.wg.Go(func() {
		if err := s.srv.Serve(l.Listener(ln)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Errorw("console stopped", "err", err)
		}
	})
	return s, nil
}

// Addr is the address the console listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server, waiting at most a second for requests in progress. Idempotent.
func (s *Server) Close() error {
	var err error
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err = s.srv.Shutdown(ctx); err != nil {
			err = s.srv.Close()
		}
		s.wg.Wait()
	})
	return err
}

// CheckAddr returns an error for an address New would refuse: malformed, or not loopback
// while public is false. Callers use it to refuse a bad address before starting anything.
func CheckAddr(addr string, public bool) error {
	err := transport.CheckLoopback(addr)
	switch {
	case errors.Is(err, transport.ErrNotLoopback) && public:
		return nil
	case errors.Is(err, transport.ErrNotLoopback):
		return fmt.Errorf("console %w; use 127.0.0.1:PORT, or pass --console-public to expose it on purpose", err)
	case err != nil:
		return fmt.Errorf("console %w", err)
	}
	return nil
}

// Handler returns the console's routes over src.
func Handler(src Source) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/status", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, src.Status())
	})
	mux.HandleFunc("GET /api/peers", func(w http.ResponseWriter, _ *http.Request) {
		peers := src.Peers()
		if peers == nil {
			peers = []Peer{}
		}
		writeJSON(w, http.StatusOK, Peers{Peers: peers})
	})
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, Health{Status: "ok", Ready: src.Ready()})
	})
	mux.HandleFunc("GET /health/ready", func(w http.ResponseWriter, _ *http.Request) {
		h := Health{Status: "ok", Ready: src.Ready()}
		code := http.StatusOK
		if !h.Ready {
			code = http.StatusServiceUnavailable
		}
		writeJSON(w, code, h)
	})
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		log.Debugw("console write", "err", err)
	}
}
