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
// clear its penalty. Within each class the first target is reputation.Select's pick, so
// 5 % of picks are uniform over the class's peers (exploration) and the rest are weighted
// by Weight(score) × performance × spare; the others follow by descending weight, ties by
// peer ID (its string form), picked in one linear pass, not by sorting every candidate. The
// list is cut at MaxMeshAttempts (3). When every candidate is cooling (route explicit),
// they are tried in their given order. A decision whose mesh attempts put a penalized peer
// behind a clean one says so (Decision.Penalized), and the executor counts it as
// routes_penalized.
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
// # Cost
//
// A decision over 1,000 peers is one pass over the snapshot, one RankIndices (whose indices
// lead straight back to the peers), one Select and one pass for the fallbacks: about 1.5
// times reputation's Rank and Select alone (BenchmarkDecide), provided the caller supplies
// two things. Peer.Key carries the peer ID's string form, cached by the caller: encoding it
// costs about 1.5 µs a peer. Snapshot.Scratch lends Decide working memory it reuses from
// call to call: without it a decision allocates about 80 KB, which costs more than the
// decision itself.
package route
