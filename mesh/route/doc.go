// Package route is the router's decision: given a request and a snapshot of what this node
// knows (its own backend, the mesh's peers, the cloud tier, the reputation store), which
// model to run and which targets to try, in order.
//
// Decide is a pure function of (request, snapshot, now, rng): it reads no clock, keeps no
// state, starts no goroutine, and draws its only randomness from the *rand.Rand it is given,
// so a seeded rng gives the same decision every time. It reads the reputation store through
// RankIndices, Performance and Params, which take now like everything else there. The
// package must not import transport, node, testnet or pion.
//
// # Tiers and eligibility
//
// A request can be served by three tiers: this node's backend (local), a peer (mesh) or
// the cloud (cloud). The request's preferences, Prefs.Or(inference.DefaultPrefs()), decide
// which are allowed: privacy local-only allows local; mesh allows local and mesh; any
// allows all three.
//
//   - local is eligible when the node accepts work (Local.Accepting) and serves the model;
//   - a peer is eligible when its registry entry is not stale, its verified vector says it
//     accepts work and announces the model, its spare capacity 1 − InFlight/Capacity is
//     above 0 (capacity 0 means not said: spare 1), and the reputation store does not
//     exclude it (score below 40);
//   - the cloud is eligible when it is Enabled (configured, and the owner's consent already
//     checked by the caller) and serves the model (Cloud.Models empty means any name may be
//     tried).
//
// # Cooling
//
// Target health (reputation Layer 1) applies to every target of the model in the allowed
// tiers, local and cloud included (their keys are reputation.LocalTarget and CloudTarget):
// all are ranked together by reputation's Rank, so a cooling target is dropped while any
// non-cooling one remains, in any tier. When every target is cooling, route explicit keeps
// them all (the model stays reachable) and route auto keeps none, so auto moves on to
// another model. Exclusion is decided before cooling: an excluded peer never counts as "a
// non-cooling target that remains".
//
// # Mesh order
//
// Eligible peers become reputation.Candidates: score, performance × ColdFactor (0.5) when
// the peer's copy of the model is cold, spare capacity. They form two penalty classes
// (NODE_REP): clean peers, then peers out of cooldown that still carry a residual penalty
// for the model, so a recovered peer is tried only after every clean one until successes
// clear its penalty. The clean class is split in two: peers this node is connected to, then
// those it is not (Peer.Unconnected): a peer that just left keeps a fresh vector for a few
// heartbeats, and would otherwise spend an attempt on a dial that cannot succeed (found by
// reliability case F19, churn). Silent peers (Peer.Silent: one of this node's requests has
// waited on the peer for its first token past the executor's bound, a frozen peer's sign
// seconds before its timeout says so) go with the unconnected ones (found by L4, the
// soak). Within each class the first target is reputation.Select's pick, so
// 5 % of picks are uniform over the class's peers (exploration) and the rest are weighted
// by Weight(score) × performance × spare; the others follow by descending weight, ties by
// peer ID (its string form), picked in one linear pass, not by sorting every candidate. The
// list is cut at MaxMeshAttempts (3). The stale-peer boost: while some penalized peer's
// latest failure for the model is StaleAfter (1 min) old or more, 5 % of the decisions
// lead with one of them, drawn uniformly, the rest of the order as usual; so a peer that
// recovered earns the successes that clear its penalty within minutes instead of waiting
// out its half-life behind the clean ones (docs/reliability.md F3). When every candidate
// is cooling (route explicit), they are tried in their given order. A decision whose mesh attempts put a penalized peer
// behind a clean one says so (Decision.Penalized), and the executor counts it as
// routes_penalized.
//
// # Latency
//
// A peer that is slow for this node to reach or to answer (a far or throttled link, a
// busy host) loses its share to the quicker ones, by its estimated time to first token
// (docs/reliability.md F3). The estimate comes from what this node measured of it
// (reputation's Candidate.Latency: the geometric moving average of the times to first
// token the executor recorded with RecordPerformance, and the confidence c in it, full
// after five recent samples and fading with a 2 min half-life), or, for a peer never
// measured, from its round trip (Peer.RTT). With q the quickest latency measured of any
// eligible peer:
//
//	measured before   estimate = c × measured + (1 − c) × q
//	never measured    estimate = max(RTT, q)       (a first token takes a round trip at least)
//	factor            = ((best + slack) ÷ (estimate + slack))²
//
// best is the least estimate among the eligible peers and slack Tuning.LatencySlack (50 ms),
// so that jitter of a few ms does not move traffic. The factor multiplies the peer's
// performance in its weight, on top of reputation's own performance factor (which compares
// latency and decode rate with the mean of measured peers, within ×4 either way, and which
// a noisy decode rate on short completions can outweigh). A peer k times slower than the
// best weighs about 1/k² as much: with two quick peers and one ten times slower, the slow
// one leads about ε/3 + 0.95 × 0.01/2.01 ≈ 2.1 % of the decisions. A peer with neither a
// measurement nor a round trip keeps its weight and is left out of best.
//
// What the rule keeps: the peer with the least estimate keeps its full weight, so a
// healthy peer is never starved; every factor is in (0, 1]; exploration (ε, uniform over
// the class) still sends the slow peer about ε/n of the requests, so it keeps being
// measured and regains its share once it is quick again, the sooner as its old
// measurements fade (the stale-peer boost: a peer left alone comes back to par, q, and is
// tried again). The round trip counts only until the first measurement: the peerstore's
// average follows a change of the link over some twenty pings (one a heartbeat, 15 s), far
// more slowly than measurements do. The rule changes no score: being slow is not
// misbehaviour, and a timeout already counts as a failure (reputation's performance class
// does move a score, by 15 points at most and never below the floor of 40).
// TestSlowPeerF3Virtual plays F3 on virtual time with the real store.
//
// # Estimates
//
// Each tier gets an Estimate for the model, n being the completion budget
// (EffectiveMaxTokens) and the prompt counted as content bytes ÷ 4 tokens:
//
//	local  tps = measured, or 50 tokens/s;  TTFT = cold start (measured, or 2 s) if cold, + 1/tps
//	mesh   tps = 50 × clamp(performance of the first mesh target, 0.25, 4);
//	       TTFT = that peer's RTT + 2 s if its model is cold + 1/tps
//	cloud  tps = Cloud.TokensPerSec, or 50;  TTFT = Cloud.TTFT, or 400 ms
//	all    Total = TTFT + n/tps;  USD = price per million tokens × (prompt + n) / 1e6
//
// Local costs nothing; the mesh costs Snapshot.MeshUSDPerMTok (0 by default).
//
// # Tier order
//
// The tiers that can serve are ordered by the request's priority, lowest first:
//
//	cost      USD
//	latency   Total
//	balanced  Total in seconds + USD × 100   (one cent weighs as much as one second)
//
// Ties go local, then mesh, then cloud. Attempts lists the best tier's targets, then the
// next tier's: local gives one target, mesh up to three, cloud one. The router tries them
// in order, moving to the next on failure.
//
// # Speculative dispatch
//
// When privacy is any, priority is not cost, the cloud is eligible and local is eligible
// with the model cold, the decision is Speculative: Attempts becomes local, cloud, then the
// rest in their order, and the router starts the cloud stream while the local model loads.
// Never under local-only (the request may not leave the node) or cost (the cloud stream
// would be paid for only to be thrown away).
//
// # Model choice
//
// Route explicit never changes the model: the named one is routed, or nothing is. Route
// auto keeps the named model when some tier can serve it. When the request names none ("" or
// inference.AutoModel), or nobody can serve the one it names, every model known in the
// allowed tiers (local models, models announced by eligible peers, the cloud's list) is
// decided in turn and the one whose best tier scores lowest under the priority wins, ties by
// name; Decision.Model says which. When no target remains, Attempts is empty and the caller
// answers model_not_found (local_unavailable under local-only). Under route explicit,
// "auto" is a model name like any other.
//
// Preferences are expected to be validated (inference.Prefs.Validate); should one not be,
// an unknown privacy allows the local tier only and an unknown priority counts as balanced.
//
// # Placement
//
// A model too big for one node runs as a pipeline of stages (inference/stage.go), and
// PlanStages decides which peers hold which layers. Like Decide it is a pure function:
// what it knows of each candidate comes in the StageCandidate (budget, measured layer time,
// measured delay to the head, score, paused), what it knows of the links between them in
// StageLinks, and the same inputs give the same plan whatever their order.
//
// A candidate is eligible unless it is paused or scores under 40 (reputation.ExcludeBelow),
// as in routing. A stage holding k of a model's L layers needs
// k × LayerBytes + ⌈k × KVBytesPerToken × positions ÷ L⌉ bytes (StageBytes): its layers'
// weights and their share of the KV cache for the positions of the generation (the whole
// context window by default), within the candidate's budget. The head's own part
// (embeddings, output projection: HeadBytes) is not planned here.
//
// The estimated time per token of a plan is the stages' compute, Σ layers × layer time,
// plus the boundaries the hidden state crosses, each counted once: head → first stage,
// each stage → the next, last stage → head. A boundary with the head is the candidate's
// Delay (half its measured round trip); one between two candidates is their measured link,
// or else estimated through the head, from.Delay + to.Delay (the path the data takes when
// the head relays it, and by the triangle inequality an upper bound of the direct one).
// An unknown layer time is LayerBytes ÷ DefaultStageBandwidth (50 tokens/s of a 4 GiB
// model).
//
// The rule: the fewest stages that can hold the model; among plans with that many, the
// least estimated time per token; but first, warm ranges (below). Within a plan the faster
// stages hold as many layers as they can (every stage holds one at least), and ranges are
// contiguous in pipeline order.
// Ties go to candidates in the order of layer time, capacity, delay and peer ID, so equal
// candidates are told apart by peer ID, and stages go in peer ID order when their order
// makes no difference. A model that fits on one candidate gets one stage (the router may
// serve it whole, as before); one that the eligible candidates cannot hold together gets a
// *ShortfallError saying how many layers, and how many bytes free on one more node, are
// missing.
//
// PlanRange places a range of the layers by the same rule, and PlanAround plans a pipeline
// in which one given stage keeps its peer and range while the other peers hold the layers
// before and after it: how the executor isolates one stage of a pipeline that failed
// verification (node/dispatch).
//
// Warm ranges. A candidate tells which ranges of the model it holds loaded now
// (StageCandidate.Warm, from its vector's warm stages). When some chain of such ranges,
// held by distinct eligible candidates, each within its candidate's budget, covers the L
// layers in the fewest stages k, the plan is the chain of least estimated time per token
// among them (ties: ranges in the order of Lo, Hi, then candidates in the order above), even
// when a plan loading new ranges would estimate less: loading costs seconds (a cold start
// per stage, and the memory of ranges unloaded to make room), a per-token difference of
// that size needs thousands of tokens to repay it, and a mesh that keeps reusing the ranges
// it loaded stops churning them. A chain of more than k stages is not taken: fewest stages
// comes first. No chain has fewer than k (its candidates' capacities add up to L), so the
// search is for chains of exactly k. A candidate's budget holds a warm range when the
// range's StageBytes fits it, as for a new range: the budget is all the node gives mesh
// work and the range is counted in it once (the node unloads the ranges no session uses to
// make room, inference/synth's Stage memory). Partly warm plans (some stages warm, others
// loading) are not told apart from cold ones. The stages of a plan that the candidate
// holds already are marked Warm.
//
// How: the fewest stages k is the fewest largest capacities that add up to L. When every
// boundary goes through the head, a plan's estimate is Σ (layers × time + 2 × delay) over
// its stages whatever their order, and a dynamic programme over (stages, layers placed)
// finds the best set exactly in O(candidates × k × L), skipping candidates that k others
// match or beat on capacity, speed and delay at once. With no link measured that is the
// plan. Measured links make some plans better, and finding the best is then a search:
// stages are ordered exactly (Held–Karp) up to 8 of them and by moving runs of stages
// beyond; a local search exchanges one stage for another candidate while that lowers the
// estimate, from the exact plan above and from plans that bring in the pairs whose link
// saves the most over the head's path; with two stages every linked pair is costed.
// The warm chain is a dynamic programme over (warm range, stages so far) in the order of the
// ranges' first layers, each range extended by those starting where it ends; it keeps one
// chain per state and extends it only by candidates not on it, so where one candidate holds
// two disjoint ranges of the model it may miss the least chain (never giving an invalid
// one). It runs only when a candidate announces a warm range.
//
// S5 (TestPlanQuality): on 1,000 random small meshes (up to 6 candidates, 12 layers, up to
// 5 stages), without and with measured links, the plan always has the fewest stages and
// has so far matched the exhaustive search's best exactly (the goal is 1.05 times at most).
// On larger meshes (10 to 24 candidates, up to 4 stages, half the links measured) the
// search is a heuristic: BenchmarkPlanMedium reports how often it finds the best of every
// set of candidates, and its worst ratio to it. BenchmarkPlan times a 70-layer model over
// 200 candidates against a goal of 1 ms on 2 cores, with and without warm ranges (with them
// the chain found skips the search). TestPlanWarm and TestPlanWarmQuality (random small
// meshes against every chain of warm ranges) check the warm rule.
//
// # Cost
//
// A decision over 1,000 peers is one pass over the snapshot, one RankIndices (whose indices
// lead straight back to the peers), three short passes of the latency rule (arithmetic
// only: the store caches each peer's latency), one Select and one pass for the fallbacks: about 1.5
// times reputation's Rank and Select alone (BenchmarkDecide), provided the caller supplies
// two things. Peer.Key carries the peer ID's string form, cached by the caller: encoding it
// costs about 1.5 µs a peer. Snapshot.Scratch lends Decide working memory it reuses from
// call to call: without it a decision allocates about 80 KB, which costs more than the
// decision itself.
package route
