// Package dispatch executes one request that may leave this device: it takes a snapshot
// of this node, the peer registry and the cloud tier, asks mesh/route where to go, and runs
// the attempts in order across the three tiers (local backend, a peer, the cloud):
//
//   - a failure before the first token moves the whole request to the next target
//     (failover), with nothing kept of the failed attempt; the peers it goes on to are
//     decided again then (run.refreshed), so that a request does not spend its attempts
//     on peers that others found stalled or gone while it waited; and a peer holding a
//     request of this node silent past Config.SilentAfter is tried after the others
//     (route.Peer.Silent);
//   - a failure after tokens streamed resumes on the next target when both serve the model
//     deterministically, the way the viability gate picks (migrate.go): the new target
//     replays the tokens the client has (or regenerates them), they come back first,
//     checked and skipped, so the client sees one contiguous stream; a prefix that differs
//     ends the request with verification_failed; where resumption is impossible the
//     request ends with the typed error;
//   - a peer that leaves with notice mid-stream hands its KV cache over on the stream, and
//     the executor relays it to a replacement that goes on from it, when the gate picks
//     live transfer (handover.go);
//   - a speculative decision (a cold local model, the cloud allowed) loads the local model
//     while a cloud stream starts: whichever comes first, local ready or the cloud's first
//     token, serves, and a losing cloud stream is cancelled;
//   - a sample of the requests one plan served (a peer, or a pipeline of stages), of
//     models this node knows to be deterministic, is verified afterwards on other plans of
//     vetted peers only, two out of three deciding, and each stage of an outvoted pipeline
//     run again alone among vetted peers to tell which lied (verify.go, isolate.go);
//   - a coordinator's thin client can get its tokens straight from the serving peer over
//     WebRTC; the executor picks the peer, relays the set-up and checks and meters the
//     peer's receipt (direct.go).
//
// Every attempt's outcome goes to the reputation store, and a degraded route (a peer timing
// out, the cloud failing) calls Config.Degraded (the node re-runs its capability probe).
//
// The executor holds no pointer to the node: everything it uses comes through Config, as
// small interfaces declared here (Peers, Registry, Meter...) or plain values. Time comes
// from Config.Now, randomness from Config.Seed, so that its tests run on virtual time
// (testing/synctest) with in-memory targets. No lock is held across I/O: backend model
// listings must answer from memory (inference.Backend), and every call out happens with
// the executor's mutex released.
//
// Local-only requests never reach this package: the API hands them to inference/localonly.
package dispatch
