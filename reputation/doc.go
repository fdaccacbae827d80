// Package reputation decides which serving targets a node should avoid and which peers
// deserve its traffic. It is a pure leaf: standard library only. It must not import other
// meshinfer packages, libp2p or pion (mesh and transport may import it, not the reverse), and
// it has no network, no goroutines and no clock. Every method takes now; ageing is computed lazily from
// it, so tests drive time by passing it and the owner needs no background loop (it may call
// Prune on its own tick). Nothing here is gossiped or persisted: a restart forgets all.
//
// # Layer 1: target health
//
// A Target is a (model, serving target) pair, the target being a peer ID or LocalTarget
// (this node's own backend). After each attempt the router calls Record with an Outcome.
// Timeout and Unavailable start a cooldown of CooldownBase·2^(n−1) for the n-th failure in a
// row, capped at CooldownMax, and add FailurePenalty to a local penalty. Failures recorded
// while the target is cooling are the same incident seen by attempts already under way
// (a frozen peer fails every request it held, at once): they add their penalty and score
// debit but neither lengthen the streak nor the cooldown, which grows only with attempts
// that fail after it ended. Success clears the
// cooldown and multiplies the penalty by SuccessPenaltyFactor, so a few successes remove it;
// the penalty also halves every PenaltyHalfLife. ContextOverflow, Rejected and
// ClientDisconnected say nothing about the target's health and change nothing.
//
// Order filters and sorts a model's candidates: cooling targets go if anything else is left;
// the rest are sorted by penalty (stable), so a target fresh out of cooldown waits behind
// clean ones. When every candidate is cooling, Explicit routing gets them all back (the
// model stays reachable) and Auto routing gets none (pick another model or tier). Stats
// reports penalized_targets and routes_penalized for the console.
//
// # Layer 2: node score
//
// Each peer has a score in [0, 100], neutral 50 when unknown, built from three classes kept
// apart, each a set of counters that decay with their own half-life. Record feeds
// availability, RecordPerformance performance, Observe heartbeats and integrity:
//
//	availability  successes (+), timeouts, unavailable, missed heartbeats (−)
//	performance   latency and throughput against the mean over measured peers, in log2 units
//	integrity     verifications passed (+), failed, forged announcements, malformed frames (−)
//
//	score = clamp( max(50 + avail⁺ + avail⁻ + integ⁺ + perf, AvailabilityFloor) + integ⁻ , 0, 100)
//
// where perf = PerformanceWeight · clamp(rel, ±PerformanceRange)/PerformanceRange ·
// confidence, and confidence grows with recent samples and fades when they stop. The floor
// (40 by default) means a partition, a flaky link or a slow GPU can never exclude an honest
// peer; cooldowns handle those. Only integrity debits reach below it, and they are large
// (one failed verification excludes even a perfect peer) and sticky (12 h half-life). Scores
// survive disconnect and reconnect; only Forget, Prune after Retain, or eviction drops them.
//
// # Weight and selection
//
// Weight turns a score into a multiplier: 0 below 40 (excluded), 0.1 at 40 rising steeply to
// 0.5 at 50 (probation), then linearly to 1.0 at 90 and above. Select picks one candidate:
// with probability Exploration (5 %) uniformly among eligible ones, so the router keeps
// learning and nobody monopolises traffic; otherwise at random weighted by
// Weight(score) × performance × spare capacity. It is a pure function of its inputs and a
// seeded *rand.Rand. A routing decision is Rank (Order plus each survivor's score and
// performance, one lookup per candidate), filling in spare capacity, then Select.
// RankIndices is the same Rank returning the survivors as indices into the candidates, for
// a caller that keeps per-candidate data of its own. Each Candidate also carries the peer's
// measured latency and the confidence in it, which Select ignores and the router's latency
// rule reads (mesh/route).
//
// # Bounds
//
// The store holds at most MaxEntries (4096) health records and at most MaxEntries node
// scores. Records that carry nothing are dropped as they become idle or on Prune, and Prune
// forgets a peer nothing has happened to for Retain (1 h), health and score, unless it owes
// an integrity debit: under churn the store holds the peers of the last hour, not every
// peer ever seen (docs/reliability.md F19). Past the cap the least useful go first (idle,
// then ordinary, then cooling targets and integrity-penalised peers, oldest first within a
// class). Scores are always finite and in [0, 100]. Score reads age counters at most once
// per DecayInterval (1 s) and reuse a cached score in between, which keeps a
// 1,000-candidate decision within its 50 µs budget.
package reputation
