// Package caps defines the capability vector a node announces to the mesh (GossipSub topic
// caps/2), its documented value bounds, and how it is signed and verified.
//
// A vector is JSON shaped like the design card: runtime (browser, desktop, ios, android),
// cpu {cores, arch, model, isa_ext}, gpu {vendor, model, vram_mb, webgpu} or null with the
// list of every GPU beside it in gpus, npu {present, vendor}, ram, battery {present, level,
// charging, floor} with level and floor fractions 0-1, thermal, app_state (foreground,
// background-task, background), net {type, rtt_ms, downlink_mbps, metered}, models, the
// layer ranges held for pipelines in stages {model, lo, hi, state loading or warm}, and
// load, plus peer_id, seq, issued_at, expires_at and sig. Validate documents every bound; README's
// "Capability vector" section lists them with their units.
//
// The signature is "ed25519:<base64>" over Domain followed by the canonical encoding: the
// vector marshalled by encoding/json with sig empty (struct fields in declaration order, no
// insignificant whitespace). A receiver re-derives the canonical bytes from the decoded
// struct, so a signature made over any other byte layout (reordered keys, extra fields,
// whitespace) does not verify. Domain names the shape (v2): a caps/1 signature never
// verifies as a caps/2 vector.
//
// Verify accepts a vector only when
//   - it decodes strictly (unknown fields are refused) from at most MaxEncodedSize bytes,
//   - every value is within the bounds of Validate,
//   - the signature verifies with the ed25519 key embedded in peer_id,
//   - it has not expired at the receiver's now, and was not issued too far in the future.
//
// A vector refused for its shape or bounds that has the marks of caps/1 (gpu a list,
// battery.level in percent, cpu.isa, npu.model, net.effective, app_state active or idle) is
// refused with an error that also wraps ErrOldShape, so a receiver can tell its operator
// that the sender runs an older meshinfer.
//
// Ordering between vectors of one peer uses seq only, never the remote timestamps; the seq
// high-water mark is kept by the receiver (mesh/announce).
//
// This package is pure: no network, no clock reads (time is passed in), no goroutines. It may
// import go-libp2p's core crypto and peer packages and nothing else of the project.
package caps
